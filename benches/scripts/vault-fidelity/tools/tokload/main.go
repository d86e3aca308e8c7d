// tokload: create Vault tokens at a fixed rate against one Vault node.
// POST /v1/auth/token/create {"ttl":TTL,"policies":["default"]} with X-Vault-Token.
// Prints achieved rate, latency quantiles and errors at the end.
package main

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

func main() {
	addr := flag.String("addr", "http://127.0.0.215:8200", "vault address")
	token := flag.String("token", os.Getenv("VAULT_TOKEN"), "token")
	rate := flag.Float64("rate", 50, "tokens per second")
	dur := flag.Duration("dur", 60*time.Second, "duration")
	ttl := flag.String("ttl", "60s", "token ttl")
	conc := flag.Int("conc", 64, "max in-flight requests")
	flag.Parse()
	cl := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: *conc, MaxConnsPerHost: *conc}, Timeout: 30 * time.Second}
	body := []byte(fmt.Sprintf(`{"ttl":%q,"policies":["default"]}`, *ttl))
	sem := make(chan struct{}, *conc)
	var ok, fail, skipped atomic.Int64
	var mu sync.Mutex
	var lat []float64
	errs := map[string]int{}
	var wg sync.WaitGroup
	start := time.Now()
	go func() {
		for range time.Tick(time.Second) {
			fmt.Fprintf(os.Stderr, "tick %.3f ok=%d failed=%d\n", float64(time.Now().UnixNano())/1e9, ok.Load(), fail.Load())
		}
	}()
	interval := time.Duration(float64(time.Second) / *rate)
	next := start
	n := int(*rate * dur.Seconds())
	for i := 0; i < n; i++ {
		if d := time.Until(next); d > 0 {
			time.Sleep(d)
		}
		next = next.Add(interval)
		select {
		case sem <- struct{}{}:
		default:
			skipped.Add(1)
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			t0 := time.Now()
			req, _ := http.NewRequest("POST", *addr+"/v1/auth/token/create", bytes.NewReader(body))
			req.Header.Set("X-Vault-Token", *token)
			resp, err := cl.Do(req)
			ms := float64(time.Since(t0).Microseconds()) / 1000
			if err != nil {
				fail.Add(1)
				mu.Lock()
				errs[err.Error()]++
				mu.Unlock()
				return
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			mu.Lock()
			defer mu.Unlock()
			if resp.StatusCode != 200 {
				fail.Add(1)
				s := string(b)
				if len(s) > 200 {
					s = s[:200]
				}
				errs[fmt.Sprintf("%d %s", resp.StatusCode, s)]++
				return
			}
			ok.Add(1)
			lat = append(lat, ms)
		}()
	}
	sendEnd := time.Since(start)
	wg.Wait()
	total := time.Since(start)
	sort.Float64s(lat)
	q := func(p float64) float64 {
		if len(lat) == 0 {
			return 0
		}
		return lat[int(p*float64(len(lat)-1))]
	}
	fmt.Printf("tokload target_rate=%.0f/s planned=%d ok=%d failed=%d skipped_busy=%d send_window=%.1fs total=%.1fs achieved=%.1f/s\n",
		*rate, n, ok.Load(), fail.Load(), skipped.Load(), sendEnd.Seconds(), total.Seconds(), float64(ok.Load())/total.Seconds())
	fmt.Printf("tokload latency_ms p50=%.1f p90=%.1f p99=%.1f max=%.1f\n", q(0.5), q(0.9), q(0.99), q(1))
	for e, c := range errs {
		fmt.Printf("tokload error x%d: %s\n", c, e)
	}
}

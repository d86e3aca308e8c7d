// kvproxy: a logging HTTP proxy put between one Vault node and Consul.
// One line per request (JSON) with method, path, query, body sizes, status,
// duration, and for /v1/txn a summary of the ops (verb, key, value size).
// Counts raw TCP bytes in both directions; prints totals on SIGUSR1 and exit.
package main

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

var rx, tx, reqs atomic.Int64

type countConn struct{ net.Conn }

func (c countConn) Read(p []byte) (int, error)  { n, err := c.Conn.Read(p); rx.Add(int64(n)); return n, err }
func (c countConn) Write(p []byte) (int, error) { n, err := c.Conn.Write(p); tx.Add(int64(n)); return n, err }

type countLn struct{ net.Listener }

func (l countLn) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return countConn{c}, nil
}

type txnOp struct {
	KV *struct {
		Verb    string
		Key     string
		Value   string
		Session string
		Index   uint64
	}
}

type rec struct {
	T       string   `json:"t"`
	Node    string   `json:"node"`
	Method  string   `json:"m"`
	Path    string   `json:"p"`
	Query   string   `json:"q,omitempty"`
	ReqLen  int      `json:"req"`
	Status  int      `json:"st"`
	RespLen int64    `json:"resp"`
	DurMs   float64  `json:"ms"`
	Index   string   `json:"idx,omitempty"`
	Ops     []string `json:"ops,omitempty"`
	Body    string   `json:"body,omitempty"`
}

type lw struct {
	http.ResponseWriter
	st int
	n  int64
}

func (w *lw) WriteHeader(s int) { w.st = s; w.ResponseWriter.WriteHeader(s) }
func (w *lw) Write(p []byte) (int, error) {
	if w.st == 0 {
		w.st = 200
	}
	n, err := w.ResponseWriter.Write(p)
	w.n += int64(n)
	return n, err
}
func (w *lw) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func main() {
	listen := flag.String("listen", "127.0.0.215:8600", "listen address")
	target := flag.String("target", "http://127.0.0.215:8500", "consul")
	node := flag.String("node", "v0", "label")
	logPath := flag.String("log", "", "jsonl log (empty: no per-request log)")
	flag.Parse()
	u, _ := url.Parse(*target)
	rp := httputil.NewSingleHostReverseProxy(u)
	rp.Transport = &http.Transport{MaxIdleConnsPerHost: 64, DisableCompression: true}
	rp.FlushInterval = -1
	var mu sync.Mutex
	var out *json.Encoder
	if *logPath != "" {
		f, err := os.OpenFile(*logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			log.Fatal(err)
		}
		out = json.NewEncoder(f)
	}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reqs.Add(1)
		start := time.Now()
		var body []byte
		if r.Body != nil {
			body, _ = io.ReadAll(r.Body)
			r.Body = io.NopCloser(bytes.NewReader(body))
			r.ContentLength = int64(len(body))
		}
		w2 := &lw{ResponseWriter: w}
		rp.ServeHTTP(w2, r)
		if out == nil {
			return
		}
		re := rec{T: start.UTC().Format("15:04:05.000"), Node: *node, Method: r.Method, Path: r.URL.Path,
			Query: r.URL.RawQuery, ReqLen: len(body), Status: w2.st, RespLen: w2.n,
			DurMs: float64(time.Since(start).Microseconds()) / 1000, Index: w2.Header().Get("X-Consul-Index")}
		if r.URL.Path == "/v1/txn" {
			var ops []txnOp
			if json.Unmarshal(body, &ops) == nil {
				for _, o := range ops {
					if o.KV == nil {
						re.Ops = append(re.Ops, "non-kv")
						continue
					}
					v, _ := base64.StdEncoding.DecodeString(o.KV.Value)
					s := fmt.Sprintf("%s %s", o.KV.Verb, o.KV.Key)
					if o.KV.Value != "" {
						s += fmt.Sprintf(" val=%dB", len(v))
					}
					if o.KV.Session != "" {
						s += " sess"
					}
					re.Ops = append(re.Ops, s)
				}
			}
		} else if len(body) > 0 && len(body) < 400 {
			re.Body = string(body)
		} else if len(body) > 0 {
			re.Body = fmt.Sprintf("<%d bytes>", len(body))
		}
		mu.Lock()
		out.Encode(re)
		mu.Unlock()
	})
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatal(err)
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGUSR1, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		for s := range sig {
			fmt.Printf("%s node=%s requests=%d bytes_from_vault=%d bytes_to_vault=%d\n", time.Now().UTC().Format(time.RFC3339), *node, reqs.Load(), rx.Load(), tx.Load())
			if s != syscall.SIGUSR1 {
				os.Exit(0)
			}
		}
	}()
	log.Fatal(http.Serve(countLn{ln}, h))
}

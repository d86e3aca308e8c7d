//! When each agent of a fleet starts: all at once, on a paced ramp, or at a
//! uniform random moment of a boot window.
//!
//! A boot window is how large fleets really come up: HashiCorp's
//! 10,000-node Consul benchmark slept a random 1..1,560 s before starting
//! each agent, so the servers saw a random, not a paced, arrival of joins.
//! Every agent's moment is uniform in `[0, window)`; the moments are drawn
//! already sorted (the order statistics of `n` uniforms, one at a time), so
//! the ramp can start agents in index order without holding `n` numbers.
//!
//! A stepped run (`--steps`) starts its agents in steps: step `k` brings
//! the agents this process holds up to its [`Step::agents`], starting at
//! [`Step::at`], the step's new agents on the fleet's boot (paced, in a
//! window, or at once) as if they were a fleet of their own.
//!
//! What it is not: the ramp's loop (in `engine`), or a rate limit on dials
//! (`max_dialing` still bounds the dials in flight).

use std::time::Duration;

use crate::units::Rate;

/// How a fleet's agents start.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Boot {
    /// Every agent at once.
    AllAtOnce,
    /// At a paced rate, each start jittered within its slot.
    Ramp(Rate),
    /// Each agent at a uniform random moment of the window.
    Window(Duration),
}

/// One step of a stepped run, as this process takes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Step {
    /// Agents this process holds once the step's have started (its share
    /// of the step's fleet; never fewer than the step before).
    pub agents: u64,
    /// When the step's first agent starts, from the fleet's start.
    pub at: Duration,
}

/// The start offsets of `agents` agents, in start order.
#[derive(Debug, Clone)]
pub struct Schedule {
    boot: Boot,
    agents: u64,
    /// Agents whose offset was given.
    given: u64,
    /// The last window fraction given (in `[0, 1)`).
    last: f64,
    /// The steps still to come, last first (empty: one step at 0).
    steps: Vec<Step>,
    /// The step under way: its start, and the agents before it.
    at: Duration,
    base: u64,
}

impl Schedule {
    /// The schedule of `agents` agents started as `boot` says.
    pub fn new(boot: Boot, agents: u64) -> Self {
        Schedule {
            boot,
            agents,
            given: 0,
            last: 0.0,
            steps: Vec::new(),
            at: Duration::ZERO,
            base: 0,
        }
    }

    /// The schedule of a stepped run: each step's new agents started as
    /// `boot` says from the step's time (steps in order; counts that do
    /// not grow add nobody).
    pub fn stepped(boot: Boot, steps: &[Step]) -> Self {
        let mut rest: Vec<Step> = steps.to_vec();
        rest.reverse();
        let mut s = Schedule::new(boot, 0);
        s.steps = rest;
        s.next_step();
        s
    }

    /// Moves to the next step that adds agents; `false` when none is left.
    fn next_step(&mut self) -> bool {
        while let Some(step) = self.steps.pop() {
            let held = self.base + self.agents;
            if step.agents > held {
                self.base = held;
                self.agents = step.agents - held;
                self.at = step.at;
                self.given = 0;
                self.last = 0.0;
                return true;
            }
        }
        false
    }

    /// The offset from the fleet's start of the next agent's start, with
    /// `u` a uniform draw in `[0, 1)` (the caller's randomness, so that
    /// tests can give their own). `None` once every agent has one.
    pub fn next_with(&mut self, u: f64) -> Option<Duration> {
        if self.given >= self.agents && !self.next_step() {
            return None;
        }
        let n = self.given;
        self.given += 1;
        Some(self.at + self.within(n, u))
    }

    /// The offset of the `n`-th agent of the step under way from its start.
    fn within(&mut self, n: u64, u: f64) -> Duration {
        match self.boot {
            Boot::AllAtOnce => Duration::ZERO,
            // Jitter within the slot keeps starts from lining up on timer
            // ticks while holding the average rate.
            Boot::Ramp(rate) => rate.interval().mul_f64(n as f64 + u),
            Boot::Window(window) => {
                // The next smallest of the `left` uniforms still to come
                // above `last`: the minimum of k uniforms on [last, 1) is
                // last + (1 - last)(1 - u^(1/k)).
                let left = (self.agents - n) as f64;
                self.last += (1.0 - self.last) * (1.0 - u.powf(1.0 / left));
                window.mul_f64(self.last.min(1.0))
            }
        }
    }

    /// [`Schedule::next_with`] with a fresh random draw.
    pub fn next_offset(&mut self) -> Option<Duration> {
        self.next_with(fastrand::f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(boot: Boot, agents: u64) -> Vec<Duration> {
        let mut s = Schedule::new(boot, agents);
        std::iter::from_fn(|| s.next_offset()).collect()
    }

    #[test]
    fn all_at_once_starts_everyone_at_zero() {
        let d = all(Boot::AllAtOnce, 5);
        assert_eq!(d, vec![Duration::ZERO; 5]);
    }

    #[test]
    fn a_ramp_gives_each_agent_a_slot_of_its_own() {
        let d = all(Boot::Ramp(Rate::per_second(10.0)), 50);
        assert_eq!(d.len(), 50);
        for (n, off) in d.iter().enumerate() {
            let lo = Duration::from_millis(100 * n as u64);
            assert!(
                *off >= lo && *off < lo + Duration::from_millis(100),
                "{n}: {off:?}"
            );
        }
    }

    #[test]
    fn a_window_spreads_sorted_moments_uniformly_over_it() {
        let window = Duration::from_secs(1_000);
        let d = all(Boot::Window(window), 20_000);
        assert_eq!(d.len(), 20_000);
        assert!(d.windows(2).all(|w| w[0] <= w[1]), "not in start order");
        assert!(*d.last().unwrap() <= window);
        // Uniform: each tenth of the window holds about a tenth of the
        // starts (2,000 each; a binomial's sd is 42, so 300 off is 7 sd).
        let mut tenths = [0u32; 10];
        for off in &d {
            let t = ((off.as_secs_f64() / 100.0) as usize).min(9);
            tenths[t] += 1;
        }
        for (i, n) in tenths.iter().enumerate() {
            assert!((1_700..=2_300).contains(n), "tenth {i}: {n} of 20,000");
        }
    }

    #[test]
    fn steps_start_their_new_agents_on_the_boot_from_their_own_time() {
        let steps = [
            Step {
                agents: 3,
                at: Duration::ZERO,
            },
            // Nobody new: skipped.
            Step {
                agents: 3,
                at: Duration::from_secs(5),
            },
            Step {
                agents: 5,
                at: Duration::from_secs(10),
            },
        ];
        let mut s = Schedule::stepped(Boot::Ramp(Rate::per_second(10.0)), &steps);
        let d: Vec<Duration> = std::iter::from_fn(|| s.next_with(0.0)).collect();
        let ms = |v: u64| Duration::from_millis(v);
        assert_eq!(
            d,
            vec![ms(0), ms(100), ms(200), ms(10_000), ms(10_100)],
            "the second ramp starts over at its step"
        );
        let mut s = Schedule::stepped(Boot::AllAtOnce, &steps);
        let d: Vec<Duration> = std::iter::from_fn(|| s.next_with(0.5)).collect();
        assert_eq!(d, vec![ms(0), ms(0), ms(0), ms(10_000), ms(10_000)]);
    }

    #[test]
    fn a_window_with_fixed_draws_is_the_order_statistics() {
        // One agent: its moment is the draw's minimum of one uniform.
        let mut s = Schedule::new(Boot::Window(Duration::from_secs(100)), 1);
        let off = s.next_with(0.25).unwrap();
        assert_eq!(off, Duration::from_secs(75));
        assert_eq!(s.next_with(0.5), None);
        // Two agents, draws of 1.0: the minimum of two sits at zero, and the
        // last of them too (1 - 1^k = 0).
        let mut s = Schedule::new(Boot::Window(Duration::from_secs(100)), 2);
        assert_eq!(s.next_with(1.0), Some(Duration::ZERO));
        assert_eq!(s.next_with(1.0), Some(Duration::ZERO));
    }
}

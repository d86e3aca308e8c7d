//! Chains of services, each tier calling the next (`--service-chain`):
//! the topology of HashiCorp's 10,000-node benchmark, 1,000 chains of
//! `service-a-N` (10 instances) calling `service-b-N` (83) calling
//! `service-c-N` (85). A leaf: it imports nothing of this crate.
//!
//! An agent registers instances of one service only, so a chain is laid
//! out over consecutive agents: a chain of `s` instances takes
//! `round(s / per_agent)` agents (at least one per tier), shared out among
//! its tiers so that the busiest agent holds as few instances as can be
//! (each next agent goes to the tier with the most instances per agent,
//! D'Hondt's rule), and each tier spreads its instances evenly over its
//! agents. 10, 83, 85 at 18 per agent: 10 agents a chain, tiers of 1, 4
//! and 5 agents holding 10, 20-21 and 17 instances; 10,000 agents are
//! 1,000 chains and 178,000 instances, the benchmark's. Agent `i` is in
//! chain `i / agents_per_chain`, and the proxies of its instances watch
//! the next tier of its own chain (the last tier calls none). The
//! placement is arithmetic on the index: nothing is stored per agent.

use std::fmt;
use std::str::FromStr;

/// Most tiers in a chain (a tier is named by a letter).
pub const MAX_TIERS: usize = 26;

/// The instances of each tier of a chain, as given (`10,83,85`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainSpec {
    tiers: Vec<u32>,
}

/// Why a `--service-chain` is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChainError {
    /// A tier that is not a whole number of instances.
    #[error("service chain {spec:?}: {tier:?} is not a number of instances")]
    Tier {
        /// The chain as written.
        spec: String,
        /// The tier as written.
        tier: String,
        /// Why it does not parse.
        source: std::num::ParseIntError,
    },
    /// A tier of no instances.
    #[error("service chain {0:?}: a tier needs at least one instance")]
    Empty(String),
    /// Fewer than two tiers or more than [`MAX_TIERS`].
    #[error("service chain {spec:?}: {tiers} tier(s); a chain has 2 to {MAX_TIERS}, e.g. 10,83,85")]
    Tiers {
        /// The chain as written.
        spec: String,
        /// How many were given.
        tiers: usize,
    },
}

impl FromStr for ChainSpec {
    type Err = ChainError;

    fn from_str(s: &str) -> Result<Self, ChainError> {
        let tiers = s
            .split(',')
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .map(|t| {
                let n: u32 = t.parse().map_err(|source| ChainError::Tier {
                    spec: s.to_owned(),
                    tier: t.to_owned(),
                    source,
                })?;
                if n == 0 {
                    return Err(ChainError::Empty(s.to_owned()));
                }
                Ok(n)
            })
            .collect::<Result<Vec<u32>, _>>()?;
        if !(2..=MAX_TIERS).contains(&tiers.len()) {
            return Err(ChainError::Tiers {
                spec: s.to_owned(),
                tiers: tiers.len(),
            });
        }
        Ok(ChainSpec { tiers })
    }
}

impl fmt::Display for ChainSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (k, n) in self.tiers.iter().enumerate() {
            if k > 0 {
                f.write_str(",")?;
            }
            write!(f, "{n}")?;
        }
        Ok(())
    }
}

impl<'de> serde::Deserialize<'de> for ChainSpec {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <String as serde::Deserialize>::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// A chain laid out over agents at so many instances per agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chains {
    /// Per tier: (agents, instances).
    tiers: Vec<(u32, u32)>,
    /// Agents of one whole chain.
    per_chain: u32,
}

/// Where one agent sits in the chains.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Place {
    /// Which chain (0 upward).
    pub chain: u64,
    /// Which tier of it (0 is the first caller).
    pub tier: usize,
    /// The instances this agent registers.
    pub instances: u32,
}

impl Place {
    /// The service of this place: its tier's in its chain.
    pub fn service(&self, base: &str) -> String {
        Chains::service(base, self.chain, self.tier)
    }
}

impl Chains {
    /// `spec` laid out at about `per_agent` instances an agent (at least 1).
    pub fn new(spec: &ChainSpec, per_agent: u32) -> Self {
        let per_agent = per_agent.max(1);
        let total: u64 = spec.tiers.iter().map(|&n| u64::from(n)).sum();
        let count = spec.tiers.len() as u32;
        let per_chain = ((total as f64 / f64::from(per_agent)).round() as u32).max(count);
        let mut tiers: Vec<(u32, u32)> = spec.tiers.iter().map(|&n| (1, n)).collect();
        for _ in count..per_chain {
            // The tier whose agents hold the most instances each: n / a
            // compared as n * a' against n' * a.
            let busiest = (0..tiers.len())
                .max_by(|&x, &y| {
                    let (ax, nx) = tiers[x];
                    let (ay, ny) = tiers[y];
                    (u64::from(nx) * u64::from(ay))
                        .cmp(&(u64::from(ny) * u64::from(ax)))
                        .then(y.cmp(&x))
                })
                .unwrap_or(0);
            tiers[busiest].0 += 1;
        }
        Chains { tiers, per_chain }
    }

    /// Agents of one whole chain.
    pub fn agents_per_chain(&self) -> u32 {
        self.per_chain
    }

    /// Instances of one whole chain.
    pub fn instances_per_chain(&self) -> u64 {
        self.tiers.iter().map(|t| u64::from(t.1)).sum()
    }

    /// The most instances any agent registers.
    pub fn max_per_agent(&self) -> u32 {
        self.tiers
            .iter()
            .map(|&(agents, n)| n.div_ceil(agents))
            .max()
            .unwrap_or(1)
    }

    /// Agent `index`'s chain, tier and instances.
    pub fn place(&self, index: u64) -> Place {
        let chain = index / u64::from(self.per_chain);
        let mut at = (index % u64::from(self.per_chain)) as u32;
        for (tier, &(agents, n)) in self.tiers.iter().enumerate() {
            if at < agents {
                // The first `n % agents` agents of the tier take one more.
                let instances = n / agents + u32::from(at < n % agents);
                return Place {
                    chain,
                    tier,
                    instances,
                };
            }
            at -= agents;
        }
        unreachable!("an index modulo the chain's agents falls in one of its tiers")
    }

    /// The service of `tier` in `chain`: `{base}-{letter}-{chain}`
    /// (`service-a-7`, as the benchmark named them).
    pub fn service(base: &str, chain: u64, tier: usize) -> String {
        let letter = char::from(b'a' + tier as u8);
        format!("{base}-{letter}-{chain}")
    }

    /// The service agent `p`'s proxies call: the next tier of its chain,
    /// none from the last.
    pub fn upstream(&self, base: &str, p: Place) -> Option<String> {
        (p.tier + 1 < self.tiers.len()).then(|| Self::service(base, p.chain, p.tier + 1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_benchmarks_chain_at_18_per_agent() {
        let spec: ChainSpec = "10, 83,85".parse().unwrap();
        assert_eq!(spec.to_string(), "10,83,85");
        let c = Chains::new(&spec, 18);
        assert_eq!(c.agents_per_chain(), 10);
        assert_eq!(c.instances_per_chain(), 178);
        assert_eq!(c.max_per_agent(), 21);
        let places: Vec<Place> = (0..20).map(|i| c.place(i)).collect();
        // Every chain holds each tier's instances exactly.
        for chain in 0..2 {
            for (tier, agents, want) in [(0, 1, 10), (1, 4, 83), (2, 5, 85)] {
                let of: Vec<&Place> = places
                    .iter()
                    .filter(|p| p.chain == chain && p.tier == tier)
                    .collect();
                assert_eq!(of.len(), agents, "chain {chain} tier {tier}");
                let got: u32 = of.iter().map(|p| p.instances).sum();
                assert_eq!(got, want, "chain {chain} tier {tier}");
            }
        }
        assert_eq!(
            places[0],
            Place {
                chain: 0,
                tier: 0,
                instances: 10
            }
        );
        assert_eq!(
            places[1],
            Place {
                chain: 0,
                tier: 1,
                instances: 21
            }
        );
        assert_eq!(
            places[4],
            Place {
                chain: 0,
                tier: 1,
                instances: 20
            }
        );
        assert_eq!(
            places[5],
            Place {
                chain: 0,
                tier: 2,
                instances: 17
            }
        );
        assert_eq!(places[10].chain, 1);
        assert_eq!(Chains::service("service", 7, 1), "service-b-7");
        assert_eq!(
            c.upstream("service", places[0]).as_deref(),
            Some("service-b-0")
        );
        assert_eq!(
            c.upstream("service", places[11]).as_deref(),
            Some("service-c-1")
        );
        assert_eq!(c.upstream("service", places[9]), None);
    }

    #[test]
    fn a_small_tier_still_gets_an_agent() {
        let c = Chains::new(&"1,2".parse().unwrap(), 50);
        assert_eq!(c.agents_per_chain(), 2);
        assert_eq!(
            c.place(1),
            Place {
                chain: 0,
                tier: 1,
                instances: 2
            }
        );
        assert_eq!(
            c.place(2),
            Place {
                chain: 1,
                tier: 0,
                instances: 1
            }
        );
    }

    #[test]
    fn bad_chains_are_refused_with_the_chain_named() {
        for (s, want) in [
            ("10", "1 tier(s)"),
            ("10,x", "\"x\" is not a number"),
            ("10,0", "at least one instance"),
            ("", "0 tier(s)"),
        ] {
            let e = s.parse::<ChainSpec>().unwrap_err().to_string();
            assert!(e.contains(want), "{s:?}: {e}");
        }
        let many = vec!["1"; MAX_TIERS + 1].join(",");
        assert!(many.parse::<ChainSpec>().is_err());
    }
}

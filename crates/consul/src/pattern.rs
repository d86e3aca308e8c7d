//! Per-agent names: a pattern such as `svc-{i}` or `app/{i%10}/` that
//! gives each agent index its own name (upstreams, KV prefixes). A leaf:
//! it imports nothing of this crate.

/// A service name that may depend on the agent index: `svc-{i}`, `svc-{i%100}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamePattern {
    parts: Vec<Part>,
}

/// Why a name pattern does not parse: one variant per mistake, each
/// naming the pattern as written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PatternError {
    /// A `{` with no `}` after it.
    #[error("name {0:?}: unclosed '{{'")]
    Unclosed(String),
    /// `{i%N}` whose `N` is not a number.
    #[error("name {name:?}: {{{inner}}}: N must be a number")]
    Modulo {
        /// The pattern.
        name: String,
        /// What the braces hold.
        inner: String,
        /// Why `N` is not a number.
        source: std::num::ParseIntError,
    },
    /// `{i%0}`.
    #[error("name {0:?}: {{i%0}} divides by zero")]
    ZeroModulo(String),
    /// Braces around something other than `i` or `i%N`.
    #[error("name {name:?}: unknown pattern {{{inner}}} (use {{i}} or {{i%N}})")]
    Unknown {
        /// The pattern.
        name: String,
        /// What the braces hold.
        inner: String,
    },
    /// A `}` with no `{` before it.
    #[error("name {0:?}: unmatched '}}'")]
    Unmatched(String),
    /// An empty name.
    #[error("empty service name")]
    Empty,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Lit(String),
    Index { modulo: Option<u64> },
}

impl NamePattern {
    /// Whether this prefix (the same for every agent) holds `key`.
    pub fn holds(&self, key: &str) -> bool {
        self.is_fixed() && key.starts_with(crate::modes::kv_normal_prefix(&self.expand(0)))
    }

    /// Parses a name; `{i}` is the agent index, `{i%N}` the index modulo `N`.
    pub fn parse(s: &str) -> Result<Self, PatternError> {
        let mut parts = Vec::new();
        let mut rest = s;
        let name = || s.to_owned();
        while let Some(open) = rest.find('{') {
            if open > 0 {
                parts.push(Part::Lit(rest[..open].to_owned()));
            }
            let close = rest[open..]
                .find('}')
                .ok_or_else(|| PatternError::Unclosed(name()))?
                + open;
            let inner = rest[open + 1..close].trim();
            let part = if inner == "i" {
                Part::Index { modulo: None }
            } else if let Some(m) = inner.strip_prefix("i%") {
                let n: u64 = m.trim().parse().map_err(|source| PatternError::Modulo {
                    name: name(),
                    inner: inner.to_owned(),
                    source,
                })?;
                if n == 0 {
                    return Err(PatternError::ZeroModulo(name()));
                }
                Part::Index { modulo: Some(n) }
            } else {
                return Err(PatternError::Unknown {
                    name: name(),
                    inner: inner.to_owned(),
                });
            };
            parts.push(part);
            rest = &rest[close + 1..];
        }
        if rest.contains('}') {
            return Err(PatternError::Unmatched(name()));
        }
        if !rest.is_empty() {
            parts.push(Part::Lit(rest.to_owned()));
        }
        if parts.is_empty() {
            return Err(PatternError::Empty);
        }
        Ok(NamePattern { parts })
    }

    /// Whether the name is the same for every agent.
    pub fn is_fixed(&self) -> bool {
        self.parts.iter().all(|p| matches!(p, Part::Lit(_)))
    }

    /// The name for agent `index`.
    pub fn expand(&self, index: u64) -> String {
        let mut out = String::new();
        for p in &self.parts {
            match p {
                Part::Lit(s) => out.push_str(s),
                Part::Index { modulo: None } => out.push_str(&index.to_string()),
                Part::Index { modulo: Some(n) } => out.push_str(&(index % n).to_string()),
            }
        }
        out
    }
}

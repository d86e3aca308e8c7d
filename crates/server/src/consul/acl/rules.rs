//! ACL rules: the HCL subset a policy's `Rules` are written in, and what a
//! token's rules grant once merged.
//!
//! - [`parse`]: blocks `node`, `node_prefix`, `service`, `service_prefix`,
//!   `session`, `session_prefix`, `key`, `key_prefix` with
//!   `policy = "read" | "write" | "deny"` (`"list"` for keys), and the
//!   top-level `acl`, `mesh` and `operator = "..."`; the other resources
//!   Consul knows (`agent`, `event`, `query`, `keyring`, `peering`) are
//!   checked and otherwise ignored; comments `#`, `//`, `/* */`. Errors in
//!   Consul 1.20's words where it has them (`Invalid node policy: ...`).
//! - [`Rules`]: every rule of a token merged as Consul merges the policies
//!   of one token (for one name the strongest wins: deny, write, list,
//!   read), looked up as Consul's radix trees are: an exact rule beats any
//!   prefix, the longest prefix beats shorter ones, no rule denies
//!   (`default_policy = "deny"`).
//! - The identities' synthetic rules ([`node_identity`],
//!   [`service_identity`]), Consul's templates.
//!
//! Not here: HCL's JSON form, `intentions` as its own resource (read as
//! the service's), enterprise scopes.

use std::collections::HashMap;
use std::fmt;

/// A resource kind a rule is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Resource {
    /// `acl = "..."`: token and policy management.
    Acl,
    /// `node` / `node_prefix`.
    Node,
    /// `service` / `service_prefix`.
    Service,
    /// `session` / `session_prefix` (named by node).
    Session,
    /// `key` / `key_prefix`.
    Key,
    /// `mesh = "..."` (else `operator = "..."`): mesh-wide config entries.
    Mesh,
    /// A service's intentions (granted here only by managing everything).
    Intentions,
}

impl Resource {
    /// Consul's name of it (`node`, `key`, ...).
    pub(crate) fn name(self) -> &'static str {
        match self {
            Resource::Acl => "acl",
            Resource::Node => "node",
            Resource::Service => "service",
            Resource::Session => "session",
            Resource::Key => "key",
            Resource::Mesh => "mesh",
            Resource::Intentions => "intentions",
        }
    }

    /// The table of a named resource (`None` for `acl`).
    fn table(self) -> Option<usize> {
        match self {
            Resource::Acl | Resource::Mesh | Resource::Intentions => None,
            Resource::Node => Some(0),
            Resource::Service => Some(1),
            Resource::Session => Some(2),
            Resource::Key => Some(3),
        }
    }
}

/// What an operation needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Access {
    /// Reading one.
    Read,
    /// Listing (keys).
    List,
    /// Writing.
    Write,
}

impl Access {
    /// Consul's word for it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Access::Read => "read",
            Access::List => "list",
            Access::Write => "write",
        }
    }
}

/// A rule's `policy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Level {
    Deny,
    Read,
    List,
    Write,
}

impl Level {
    fn parse(s: &str) -> Option<Self> {
        match s.to_ascii_lowercase().as_str() {
            "deny" => Some(Level::Deny),
            "read" => Some(Level::Read),
            "list" => Some(Level::List),
            "write" => Some(Level::Write),
            _ => None,
        }
    }

    /// Consul's precedence when two rules name the same thing.
    fn rank(self) -> u8 {
        match self {
            Level::Read => 0,
            Level::List => 1,
            Level::Write => 2,
            Level::Deny => 3,
        }
    }

    /// Whether a rule of this level grants `need` (Consul's `enforce`).
    fn grants(self, need: Access) -> bool {
        match self {
            Level::Write => true,
            Level::List => need != Access::Write,
            Level::Read => need == Access::Read,
            Level::Deny => false,
        }
    }
}

/// One rule: a resource, a name (or prefix), a level.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Rule {
    pub(crate) resource: Resource,
    pub(crate) name: String,
    pub(crate) prefix: bool,
    pub(crate) level: Level,
}

impl Rule {
    fn new(resource: Resource, name: &str, prefix: bool, level: Level) -> Self {
        Self {
            resource,
            name: name.to_owned(),
            prefix,
            level,
        }
    }
}

/// What a policy's rules say, parsed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Parsed {
    /// `acl = "..."`.
    pub(crate) acl: Option<Level>,
    /// `mesh = "..."`.
    pub(crate) mesh: Option<Level>,
    /// `operator = "..."`.
    pub(crate) operator: Option<Level>,
    /// The named rules, in order.
    pub(crate) rules: Vec<Rule>,
}

/// Why a policy's rules were refused, in Consul 1.20's words.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum RulesError {
    /// Not the HCL subset (where, and what was found).
    #[error("Failed to parse ACL rules: At {line}:{col}: {what}")]
    Syntax {
        /// 1-based line.
        line: usize,
        /// 1-based column.
        col: usize,
        /// What was wrong there.
        what: String,
    },
    /// A block's `policy` that is no level (Go's `%#v` of the rule).
    #[error("Invalid {kind} policy: {rule}")]
    Level {
        /// `node`, `key_prefix`, ...
        kind: String,
        /// The rule as Go prints it.
        rule: String,
    },
    /// A top-level `acl = ...` (or `operator`, ...) that is no level.
    #[error("Invalid {kind} policy: {value:?}")]
    Scalar {
        /// `acl`, `operator`, ...
        kind: String,
        /// Its value.
        value: String,
    },
}

// ---------------------------------------------------------------- lexing

#[derive(Debug, PartialEq)]
enum Tok {
    Ident(String),
    Str(String),
    Open,
    Close,
    Eq,
    Comma,
}

struct Lexer<'a> {
    chars: std::iter::Peekable<std::str::Chars<'a>>,
    line: usize,
    col: usize,
}

impl Lexer<'_> {
    fn bump(&mut self) -> Option<char> {
        let c = self.chars.next()?;
        if c == '\n' {
            self.line += 1;
            self.col = 1;
        } else {
            self.col += 1;
        }
        Some(c)
    }

    fn err(&self, what: impl Into<String>) -> RulesError {
        RulesError::Syntax {
            line: self.line,
            col: self.col,
            what: what.into(),
        }
    }

    /// Skips blanks and comments.
    fn skip(&mut self) -> Result<(), RulesError> {
        loop {
            match self.chars.peek() {
                Some(c) if c.is_whitespace() => {
                    self.bump();
                }
                Some('#') => self.line_comment(),
                Some('/') => {
                    self.bump();
                    match self.bump() {
                        Some('/') => self.line_comment(),
                        Some('*') => self.block_comment()?,
                        _ => return Err(self.err("illegal char")),
                    }
                }
                _ => return Ok(()),
            }
        }
    }

    fn line_comment(&mut self) {
        while let Some(c) = self.bump() {
            if c == '\n' {
                return;
            }
        }
    }

    fn block_comment(&mut self) -> Result<(), RulesError> {
        let mut star = false;
        loop {
            match self.bump() {
                None => return Err(self.err("comment not terminated")),
                Some('/') if star => return Ok(()),
                Some(c) => star = c == '*',
            }
        }
    }

    /// The next token with where it starts, `None` at the end.
    fn next(&mut self) -> Result<Option<(Tok, usize, usize)>, RulesError> {
        self.skip()?;
        let (line, col) = (self.line, self.col);
        let Some(c) = self.bump() else {
            return Ok(None);
        };
        let tok = match c {
            '{' => Tok::Open,
            '}' => Tok::Close,
            '=' => Tok::Eq,
            ',' => Tok::Comma,
            '"' => Tok::Str(self.string()?),
            c if c.is_ascii_alphabetic() || c == '_' => {
                let mut s = String::from(c);
                while let Some(&c) = self.chars.peek() {
                    if !(c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.') {
                        break;
                    }
                    s.push(c);
                    self.bump();
                }
                Tok::Ident(s)
            }
            c => return Err(self.err(format!("illegal char {c:?}"))),
        };
        Ok(Some((tok, line, col)))
    }

    fn string(&mut self) -> Result<String, RulesError> {
        let mut s = String::new();
        loop {
            match self.bump() {
                None | Some('\n') => return Err(self.err("literal not terminated")),
                Some('"') => return Ok(s),
                Some('\\') => match self.bump() {
                    Some('n') => s.push('\n'),
                    Some('t') => s.push('\t'),
                    Some(c @ ('"' | '\\')) => s.push(c),
                    _ => return Err(self.err("invalid escape sequence")),
                },
                Some(c) => s.push(c),
            }
        }
    }
}

// ---------------------------------------------------------------- parsing

/// The block kinds Consul knows: their resource (`None`: checked, then
/// ignored here), whether a prefix, whether `list` is allowed, and Go's
/// name of the rule type and its key field.
fn block_kind(kind: &str) -> Option<(Option<Resource>, bool, bool, &'static str, &'static str)> {
    Some(match kind {
        "node" => (Some(Resource::Node), false, false, "NodeRule", "Name"),
        "node_prefix" => (Some(Resource::Node), true, false, "NodeRule", "Name"),
        "service" => (Some(Resource::Service), false, false, "ServiceRule", "Name"),
        "service_prefix" => (Some(Resource::Service), true, false, "ServiceRule", "Name"),
        "session" => (Some(Resource::Session), false, false, "SessionRule", "Node"),
        "session_prefix" => (Some(Resource::Session), true, false, "SessionRule", "Node"),
        "key" => (Some(Resource::Key), false, true, "KeyRule", "Prefix"),
        "key_prefix" => (Some(Resource::Key), true, true, "KeyRule", "Prefix"),
        "agent" | "agent_prefix" => (None, false, false, "AgentRule", "Node"),
        "event" | "event_prefix" => (None, false, false, "EventRule", "Event"),
        "query" | "query_prefix" => (None, false, false, "PreparedQueryRule", "Prefix"),
        _ => return None,
    })
}

/// Parses a policy's `Rules` (empty: no rules).
pub(crate) fn parse(src: &str) -> Result<Parsed, RulesError> {
    let mut lx = Lexer {
        chars: src.chars().peekable(),
        line: 1,
        col: 1,
    };
    let mut out = Parsed::default();
    while let Some((tok, line, col)) = lx.next()? {
        let Tok::Ident(word) = tok else {
            return Err(RulesError::Syntax {
                line,
                col,
                what: format!("expected: IDENT got: {tok:?}"),
            });
        };
        match lx.next()? {
            Some((Tok::Eq, ..)) => {
                let value = expect_str(&mut lx)?;
                scalar(&mut out, &word, value)?;
            }
            Some((Tok::Str(name), ..)) => {
                expect(&mut lx, &Tok::Open)?;
                let fields = block_body(&mut lx)?;
                block(&mut out, &word, name, &fields)?;
            }
            other => {
                return Err(lx.err(format!(
                    "key '{word}' expected start of object or '=', got {other:?}"
                )));
            }
        }
    }
    Ok(out)
}

fn expect(lx: &mut Lexer<'_>, want: &Tok) -> Result<(), RulesError> {
    match lx.next()? {
        Some((t, ..)) if &t == want => Ok(()),
        other => Err(lx.err(format!("expected {want:?}, got {other:?}"))),
    }
}

fn expect_str(lx: &mut Lexer<'_>) -> Result<String, RulesError> {
    match lx.next()? {
        Some((Tok::Str(s), ..)) => Ok(s),
        other => Err(lx.err(format!("expected a string, got {other:?}"))),
    }
}

/// `field = "value"` pairs up to the closing brace.
fn block_body(lx: &mut Lexer<'_>) -> Result<Vec<(String, String)>, RulesError> {
    let mut fields = Vec::new();
    loop {
        match lx.next()? {
            Some((Tok::Close, ..)) => return Ok(fields),
            Some((Tok::Comma, ..)) => {}
            Some((Tok::Ident(k), ..)) => {
                expect(lx, &Tok::Eq)?;
                fields.push((k, expect_str(lx)?));
            }
            other => return Err(lx.err(format!("expected a field or '}}', got {other:?}"))),
        }
    }
}

fn scalar(out: &mut Parsed, word: &str, value: String) -> Result<(), RulesError> {
    if !matches!(word, "acl" | "operator" | "keyring" | "mesh" | "peering") {
        // HCL leaves keys it does not map alone.
        return Ok(());
    }
    match Level::parse(&value) {
        Some(l) if l != Level::List => {
            match word {
                "acl" => out.acl = Some(l),
                "mesh" => out.mesh = Some(l),
                "operator" => out.operator = Some(l),
                _ => {}
            }
            Ok(())
        }
        _ => Err(RulesError::Scalar {
            kind: word.to_owned(),
            value,
        }),
    }
}

fn block(
    out: &mut Parsed,
    kind: &str,
    name: String,
    fields: &[(String, String)],
) -> Result<(), RulesError> {
    let Some((resource, prefix, list_ok, go_type, key)) = block_kind(kind) else {
        return Ok(());
    };
    let field = |f: &str| {
        fields
            .iter()
            .rev()
            .find(|(k, _)| k.eq_ignore_ascii_case(f))
            .map_or("", |(_, v)| v.as_str())
    };
    let policy = field("policy");
    let level = Level::parse(policy).filter(|l| list_ok || *l != Level::List);
    let intentions = field("intentions");
    let intentions_ok =
        intentions.is_empty() || Level::parse(intentions).is_some_and(|l| l != Level::List);
    let (Some(level), true) = (level, intentions_ok) else {
        let extra = match go_type {
            "ServiceRule" => format!(", Intentions:{intentions:?}"),
            _ => String::new(),
        };
        let ent = match go_type {
            "NodeRule" | "ServiceRule" | "KeyRule" => ", EnterpriseRule:acl.EnterpriseRule{}",
            _ => "",
        };
        return Err(RulesError::Level {
            kind: kind.to_owned(),
            rule: format!("&acl.{go_type}{{{key}:{name:?}, Policy:{policy:?}{extra}{ent}}}"),
        });
    };
    if let Some(resource) = resource {
        out.rules.push(Rule {
            resource,
            name,
            prefix,
            level,
        });
    }
    Ok(())
}

// ---------------------------------------------------------------- identities

/// A node identity's rules: `node "<n>"` write, `service_prefix ""` read.
pub(crate) fn node_identity(node: &str) -> [Rule; 2] {
    [
        Rule::new(Resource::Node, node, false, Level::Write),
        Rule::new(Resource::Service, "", true, Level::Read),
    ]
}

/// A service identity's rules: the service and its sidecar write, every
/// service and node read.
pub(crate) fn service_identity(service: &str) -> [Rule; 4] {
    [
        Rule::new(Resource::Service, service, false, Level::Write),
        Rule::new(
            Resource::Service,
            &format!("{service}-sidecar-proxy"),
            false,
            Level::Write,
        ),
        Rule::new(Resource::Service, "", true, Level::Read),
        Rule::new(Resource::Node, "", true, Level::Read),
    ]
}

// ---------------------------------------------------------------- merged

/// One resource's rules, merged.
#[derive(Clone, Debug, Default)]
struct Table {
    exact: HashMap<String, Level>,
    // Bound: a token's prefix rules (its policies' and identities').
    prefixes: Vec<(String, Level)>,
}

fn stronger(slot: &mut Level, l: Level) {
    if l.rank() > slot.rank() {
        *slot = l;
    }
}

impl Table {
    fn add(&mut self, name: &str, prefix: bool, l: Level) {
        if !prefix {
            let slot = self.exact.entry(name.to_owned()).or_insert(l);
            stronger(slot, l);
        } else if let Some((_, slot)) = self.prefixes.iter_mut().find(|(p, _)| p == name) {
            stronger(slot, l);
        } else {
            self.prefixes.push((name.to_owned(), l));
        }
    }

    /// The longest prefix rule that covers `name`.
    fn longest_prefix(&self, name: &str) -> Option<Level> {
        self.prefixes
            .iter()
            .filter(|(p, _)| name.starts_with(p.as_str()))
            .max_by_key(|(p, _)| p.len())
            .map(|(_, l)| *l)
    }

    /// The rule that decides for `name`: exact, else longest prefix.
    fn lookup(&self, name: &str) -> Option<Level> {
        self.exact
            .get(name)
            .copied()
            .or_else(|| self.longest_prefix(name))
    }
}

/// Everything a token's rules grant, merged.
#[derive(Clone, Debug, Default)]
pub(crate) struct Rules {
    acl: Option<Level>,
    mesh: Option<Level>,
    operator: Option<Level>,
    tables: [Table; 4],
}

fn merge(slot: &mut Option<Level>, l: Option<Level>) {
    match (slot.as_mut(), l) {
        (Some(s), Some(l)) => stronger(s, l),
        (None, l) => *slot = l,
        (_, None) => {}
    }
}

impl Rules {
    /// Adds rules (the strongest of two for one name wins).
    pub(crate) fn add<'a>(&mut self, rules: impl IntoIterator<Item = &'a Rule>) {
        for r in rules {
            if let Some(t) = r.resource.table() {
                self.tables[t].add(&r.name, r.prefix, r.level);
            }
        }
    }

    /// Adds a parsed policy.
    pub(crate) fn add_parsed(&mut self, p: &Parsed) {
        merge(&mut self.acl, p.acl);
        merge(&mut self.mesh, p.mesh);
        merge(&mut self.operator, p.operator);
        self.add(&p.rules);
    }

    /// Whether these rules grant `need` on `resource` `name` (`name` is
    /// ignored for `acl`).
    pub(crate) fn allows(&self, resource: Resource, need: Access, name: &str) -> bool {
        let rule = match (resource, resource.table()) {
            (_, Some(t)) => self.tables[t].lookup(name),
            (Resource::Acl, None) => self.acl,
            (Resource::Mesh, None) => self.mesh.or(self.operator),
            _ => None,
        };
        rule.is_some_and(|l| l.grants(need))
    }

    /// Consul's `KeyWritePrefix`: the longest prefix rule covering
    /// `prefix` grants write, and no rule at or under `prefix` does not.
    pub(crate) fn allows_key_write_prefix(&self, prefix: &str) -> bool {
        let t = &self.tables[3];
        if t.longest_prefix(prefix).is_some_and(|l| l != Level::Write) {
            return false;
        }
        let below_ok = t
            .exact
            .iter()
            .chain(t.prefixes.iter().map(|(n, l)| (n, l)))
            .filter(|(n, _)| n.starts_with(prefix))
            .all(|(_, l)| *l == Level::Write);
        below_ok && t.longest_prefix(prefix) == Some(Level::Write)
    }
}

impl fmt::Display for Resource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules_of(src: &str) -> Rules {
        let mut r = Rules::default();
        r.add_parsed(&parse(src).unwrap());
        r
    }

    #[test]
    fn exact_beats_prefix_and_the_longest_prefix_wins() {
        let r = rules_of(
            r#"
            # the fleet
            node_prefix "" { policy = "read" }
            node_prefix "web-" {
                policy = "write"
            }
            node "web-7" { policy = "deny" } // one bad node
            /* and one key */
            key_prefix "app/" { policy = "list" }
            "#,
        );
        assert!(r.allows(Resource::Node, Access::Write, "web-1"));
        assert!(!r.allows(Resource::Node, Access::Read, "web-7"));
        assert!(r.allows(Resource::Node, Access::Read, "db-1"));
        assert!(!r.allows(Resource::Node, Access::Write, "db-1"));
        assert!(r.allows(Resource::Key, Access::List, "app/x"));
        assert!(r.allows(Resource::Key, Access::Read, "app/x"));
        assert!(!r.allows(Resource::Key, Access::Write, "app/x"));
        assert!(!r.allows(Resource::Key, Access::Read, "other"));
        // No rule: default deny.
        assert!(!r.allows(Resource::Session, Access::Read, "web-1"));
        assert!(!r.allows(Resource::Acl, Access::Read, ""));
    }

    #[test]
    fn a_prefix_longer_than_the_name_does_not_cover_it() {
        let r = rules_of(r#"service_prefix "api-v2" { policy = "write" }"#);
        assert!(r.allows(Resource::Service, Access::Write, "api-v2-x"));
        assert!(!r.allows(Resource::Service, Access::Read, "api-v"));
    }

    #[test]
    fn merged_policies_keep_the_strongest_rule_for_one_name() {
        let mut r = Rules::default();
        r.add_parsed(&parse(r#"session_prefix "" { policy = "write" }"#).unwrap());
        r.add_parsed(&parse(r#"session_prefix "" { policy = "read" }"#).unwrap());
        assert!(r.allows(Resource::Session, Access::Write, "n1"));
        r.add_parsed(&parse(r#"session_prefix "" { policy = "deny" }"#).unwrap());
        assert!(!r.allows(Resource::Session, Access::Read, "n1"));
        // An identity's exact rule still beats the denying prefix.
        r.add(&node_identity("n1"));
        assert!(r.allows(Resource::Node, Access::Write, "n1"));
        assert!(r.allows(Resource::Service, Access::Read, "anything"));
        assert!(!r.allows(Resource::Service, Access::Write, "anything"));
    }

    #[test]
    fn a_service_identity_writes_its_service_and_sidecar_and_reads_the_rest() {
        let mut r = Rules::default();
        r.add(&service_identity("app"));
        assert!(r.allows(Resource::Service, Access::Write, "app"));
        assert!(r.allows(Resource::Service, Access::Write, "app-sidecar-proxy"));
        assert!(!r.allows(Resource::Service, Access::Write, "db"));
        assert!(r.allows(Resource::Node, Access::Read, "any"));
        assert!(!r.allows(Resource::Node, Access::Write, "any"));
    }

    #[test]
    fn acl_scalar_and_key_write_prefix() {
        let r = rules_of(
            "acl = \"read\"\nkey_prefix \"a/\" { policy = \"write\" }\nkey \"a/b/locked\" { policy = \"read\" }",
        );
        assert!(r.allows(Resource::Acl, Access::Read, ""));
        assert!(!r.allows(Resource::Acl, Access::Write, ""));
        assert!(r.allows_key_write_prefix("a/c/"));
        assert!(!r.allows_key_write_prefix("a/b/"));
        assert!(!r.allows_key_write_prefix("b/"));
    }

    #[test]
    fn the_global_management_rules_parse() {
        let p = parse(super::super::GLOBAL_MANAGEMENT_RULES).unwrap();
        assert_eq!(p.acl, Some(Level::Write));
        assert_eq!(p.rules.len(), 4, "{p:?}");
    }

    #[test]
    fn bad_rules_are_refused_in_consuls_words() {
        assert_eq!(
            parse(r#"node "x" { policy = "foo" }"#)
                .unwrap_err()
                .to_string(),
            "Invalid node policy: &acl.NodeRule{Name:\"x\", Policy:\"foo\", \
             EnterpriseRule:acl.EnterpriseRule{}}"
        );
        assert_eq!(
            parse(r#"session_prefix "" { policy = "list" }"#)
                .unwrap_err()
                .to_string(),
            "Invalid session_prefix policy: &acl.SessionRule{Node:\"\", Policy:\"list\"}"
        );
        assert_eq!(
            parse(r#"acl = "sudo""#).unwrap_err().to_string(),
            "Invalid acl policy: \"sudo\""
        );
        let e = parse("node \"x\" { policy = \"write\"").unwrap_err();
        assert!(matches!(e, RulesError::Syntax { line: 1, .. }), "{e:?}");
        assert!(parse("node {").is_err());
        assert!(parse("\"x\"").is_err());
        assert!(parse("/* open").is_err());
        // Unknown keys are left alone, as HCL leaves them.
        assert_eq!(parse("unknown = \"x\"").unwrap(), Parsed::default());
        assert_eq!(parse("").unwrap(), Parsed::default());
    }
}

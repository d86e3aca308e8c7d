//! Test support shared by agent-sim's crates; it is only ever a
//! dev-dependency, so what it pulls in (the `jsonschema` validator) stays
//! out of the `agent-sim` binary.
//!
//! - [`validate_json`]: checks a JSON value against a JSON Schema (draft
//!   2020-12), e.g. a run summary against
//!   `agent_sim_metrics::SUMMARY_SCHEMA`.
//! - [`Pki`]: a CA, a server certificate for 127.0.0.1/localhost and a
//!   client certificate, generated at test time (rcgen) as PEM files.
//! - [`alloc`]: a counting global allocator to bound what a decoder
//!   allocates; [`hostile`]: the captured vectors and proptest strategies
//!   that damage them (bit flips, truncations, huge length fields).
//! - [`fake_proc`]: a fake `/proc` tree of stated limits, for the preflight
//!   and `agent-sim doctor`.
//! - [`child`]: the server half of a memory measurement in a child process.
//! - [`bounded`]: a child process's output within a time limit, and
//!   [`bounded::until`], the one way tests wait for a state.
//! - [`source`]: the workspace's own sources, read for the checks that hold
//!   the code to its shape (sizes, imports one way, bounds documented).

pub mod alloc;
pub mod bounded;
pub mod child;
pub mod fake_proc;
pub mod hostile;
pub mod source;

use std::path::PathBuf;

/// Validates `value` against the JSON Schema `schema` (draft 2020-12, no
/// remote references); the error lists every violation as
/// `<JSON pointer>: <reason>`.
pub fn validate_json(schema: &str, value: &serde_json::Value) -> Result<(), Vec<String>> {
    let schema: serde_json::Value =
        serde_json::from_str(schema).map_err(|e| vec![format!("schema is not JSON: {e}")])?;
    let validator =
        jsonschema::draft202012::new(&schema).map_err(|e| vec![format!("schema: {e}")])?;
    let errors: Vec<String> = validator
        .iter_errors(value)
        .map(|e| {
            let at = e.instance_path().to_string();
            format!("{}: {e}", if at.is_empty() { "/" } else { at.as_str() })
        })
        .collect();
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors)
    }
}

/// Whether `schema` is itself a valid draft 2020-12 schema.
pub fn is_valid_schema(schema: &str) -> bool {
    serde_json::from_str::<serde_json::Value>(schema).is_ok_and(|s| jsonschema::meta::is_valid(&s))
}

/// A test PKI in a fresh temp directory (removed on drop): `ca.pem`,
/// `server.pem` + `server-key.pem` (names 127.0.0.1, localhost and
/// `server.dc1.consul`), `client.pem` + `client-key.pem`.
#[derive(Debug)]
pub struct Pki {
    dir: PathBuf,
}

impl Pki {
    /// Generates the files; `tag` keeps concurrent tests apart.
    pub fn new(tag: &str) -> Pki {
        let dir = std::env::temp_dir().join(format!(
            "agent-sim-pki-{tag}-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or_default()
        ));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let ca_key = rcgen::KeyPair::generate().expect("key");
        let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca_cert = ca.self_signed(&ca_key).expect("CA");
        let issuer = rcgen::Issuer::new(ca, ca_key);
        let leaf = |names: Vec<String>| {
            let k = rcgen::KeyPair::generate().expect("key");
            let c = rcgen::CertificateParams::new(names)
                .expect("params")
                .signed_by(&k, &issuer)
                .expect("leaf");
            (c.pem(), k.serialize_pem())
        };
        let (server, server_key) = leaf(vec![
            "127.0.0.1".into(),
            "localhost".into(),
            "server.dc1.consul".into(),
        ]);
        let (client, client_key) = leaf(vec!["client.agent-sim".into()]);
        for (name, pem) in [
            ("ca.pem", ca_cert.pem()),
            ("server.pem", server),
            ("server-key.pem", server_key),
            ("client.pem", client),
            ("client-key.pem", client_key),
        ] {
            std::fs::write(dir.join(name), pem).expect("write PEM");
        }
        Pki { dir }
    }

    /// The path of one of the files.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn violations_name_their_place() {
        let schema = r#"{"$schema":"https://json-schema.org/draft/2020-12/schema",
            "type":"object","required":["n"],"properties":{"n":{"type":"integer"}}}"#;
        assert!(is_valid_schema(schema));
        assert!(validate_json(schema, &serde_json::json!({"n": 1})).is_ok());
        let e = validate_json(schema, &serde_json::json!({"n": "x"})).unwrap_err();
        assert!(e[0].starts_with("/n:"), "{e:?}");
    }
}

//! Test support shared by agent-sim's crates; it is only ever a
//! dev-dependency, so what it pulls in (the `jsonschema` validator) stays
//! out of the `agent-sim` binary.
//!
//! - [`validate_json`]: checks a JSON value against a JSON Schema (draft
//!   2020-12), e.g. a run summary against
//!   `agent_sim_metrics::SUMMARY_SCHEMA`.

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

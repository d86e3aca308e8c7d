//! The run's CA rotation: `PUT /v1/connect/ca/configuration` with the
//! provider config read back and its key size changed (`ec` 256 ↔ 384).
//! The consul provider's ID hashes the private key, root certificate, key
//! type and bits, so a new size makes it generate a new root (checked on a
//! 1.20.1 dev server; a TTL change alone keeps the root). Agents learn of
//! it from their roots watch and sign again within leafcert's 30 s.

use bytes::Bytes;
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::connect::ConnectBoard;
use crate::http::{HttpApi, HttpError};

const PATH: &str = "/v1/connect/ca/configuration";

/// Changes the CA's configuration so that it makes a new root; the board
/// (when the fleet keeps certificates) times the agents from the request.
pub async fn rotate_ca(api: &HttpApi, board: Option<&ConnectBoard>) -> Result<(), HttpError> {
    let got = api.call(http::Method::GET, PATH, Bytes::new()).await?;
    let now: Value = serde_json::from_slice(&got).unwrap_or(Value::Null);
    let provider = now
        .get("Provider")
        .and_then(Value::as_str)
        .unwrap_or("consul")
        .to_owned();
    let mut config = now.get("Config").cloned().unwrap_or_else(|| json!({}));
    let bits = config
        .get("PrivateKeyBits")
        .and_then(Value::as_u64)
        .unwrap_or(256);
    config["PrivateKeyType"] = json!("ec");
    config["PrivateKeyBits"] = json!(if bits == 384 { 256 } else { 384 });
    let body = json!({"Provider": provider, "Config": config});
    if let Some(b) = board {
        b.rotation_started(Instant::now());
    }
    api.put(PATH, Bytes::from(body.to_string())).await?;
    Ok(())
}

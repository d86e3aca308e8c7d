//! Request fields as Consul's Go decoders read them: a nil where a value
//! is due reads as the zero value. A leaf: the catalog and session bodies
//! (`writes`) and the KV RPCs (`kv`) both take it from here.

use serde::{Deserialize, Deserializer};

/// Go's `null` read as the type's empty value.
pub(crate) fn nullable<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

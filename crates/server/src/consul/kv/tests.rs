//! Unit tests of the KV operations (filled in next).

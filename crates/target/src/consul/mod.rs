//! Consul RPC + HTTP subset (being written).

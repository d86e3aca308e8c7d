//! `KVS.*` calls on the multiplexed RPC port (filled in next).

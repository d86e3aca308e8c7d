//! Sensu agent endpoint (being written).

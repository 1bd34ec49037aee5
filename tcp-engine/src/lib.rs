//! tcp-engine: an MPA-aware TCP, sans-IO.

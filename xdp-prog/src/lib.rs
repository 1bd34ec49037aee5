//! XDP steering program and its loader.

//! mpa

//! rdmap

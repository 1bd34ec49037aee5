//! datapath

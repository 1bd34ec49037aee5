//! ddp

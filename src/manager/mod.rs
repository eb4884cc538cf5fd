//! Everything that speaks to Norsk Manager over gRPC.

pub mod proto;

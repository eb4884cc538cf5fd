//! Everything that speaks to Norsk Manager over gRPC: the generated code,
//! the wire <-> model conversions, the client and its event stream session,
//! and a mirror of Manager's state built from the stream.

pub mod client;
pub mod expansion;
pub mod extensions;
pub mod mirror;
pub mod port;
pub mod proto;
pub mod stream;
pub mod wire;

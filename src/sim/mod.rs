//! A Norsk Manager simulator: the Manager gRPC service over a simulated
//! fleet, plus an admin service for fault injection.

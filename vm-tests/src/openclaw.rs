//! The real OpenClaw gateway as an optional workload (see notes/openclaw-gateway.md).

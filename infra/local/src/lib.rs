//! Placeholder until the emulator lands (issue 3).

//! In-memory fakes of every port, for handler unit tests (feature `test-util`).

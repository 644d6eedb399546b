//! A notices topic that records what it was told, and can refuse notices the way SNS
//! `Publish` does (an error per call).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use super::lock;
use crate::domain::notices::Notice;
use crate::ports::{NoticeSink, PortError, PublishReport};

#[derive(Debug, Default)]
struct State {
    /// Every notice the topic took, with its event key, in order.
    told: Vec<(String, Notice)>,
    /// The next notices refused, whatever they are: (code, message).
    refuse_next: VecDeque<(String, String)>,
    /// The next call fails as a whole.
    fail_next: VecDeque<PortError>,
}

/// Records notices; clones share the record.
#[derive(Debug, Clone, Default)]
pub struct RecordingNotices {
    state: Arc<Mutex<State>>,
}

impl RecordingNotices {
    pub fn new() -> RecordingNotices {
        RecordingNotices::default()
    }

    /// The next `n` notices are refused with `code`.
    pub fn refuse_next(&self, n: usize, code: &str, message: &str) {
        let mut s = lock(&self.state);
        for _ in 0..n {
            s.refuse_next
                .push_back((code.to_string(), message.to_string()));
        }
    }

    /// The next call fails as a whole; nothing is told.
    pub fn fail_next(&self, error: PortError) {
        lock(&self.state).fail_next.push_back(error);
    }

    /// Every notice taken, with its event key, in order.
    pub fn told(&self) -> Vec<(String, Notice)> {
        lock(&self.state).told.clone()
    }

    /// The notices taken of one detail-type.
    pub fn told_of(&self, detail_type: &str) -> Vec<Notice> {
        lock(&self.state)
            .told
            .iter()
            .filter(|(_, n)| n.detail_type == detail_type)
            .map(|(_, n)| n.clone())
            .collect()
    }
}

impl NoticeSink for RecordingNotices {
    async fn notify(&self, notices: &[(String, Notice)]) -> Result<PublishReport, PortError> {
        let mut s = lock(&self.state);
        if let Some(e) = s.fail_next.pop_front() {
            return Err(e);
        }
        let mut report = PublishReport::default();
        for (key, notice) in notices {
            match s.refuse_next.pop_front() {
                Some((code, message)) => report.failed.push((key.clone(), code, message)),
                None => {
                    s.told.push((key.clone(), notice.clone()));
                    report.sent.push(key.clone());
                }
            }
        }
        Ok(report)
    }
}

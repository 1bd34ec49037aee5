//! `--pcap FILE`: the AF_XDP engine's frames, received and sent, written to a pcap file
//! (`datapath::xsk::Capture`), and what the capture reports at the end of a run.

use std::path::Path;

use datapath::xsk::{Capture, CaptureConfig, CaptureStats};
use serde::Serialize;

use crate::Transport;

/// Starts the capture `--pcap` asks for: `None` without it; an error for the socket transport,
/// whose traffic the kernel's taps see (use tcpdump there).
pub fn start(path: Option<&Path>, transport: Transport) -> Result<Option<Capture>, String> {
    let Some(path) = path else {
        return Ok(None);
    };
    if transport != Transport::Xdp {
        return Err(
            "--pcap captures the AF_XDP engine's frames (--transport xdp); capture the socket \
             transport's traffic with tcpdump"
                .into(),
        );
    }
    Capture::create(path, CaptureConfig::default())
        .map(Some)
        .map_err(|e| format!("--pcap {}: {e}", path.display()))
}

/// What a capture wrote, as `--json` reports it under `"pcap"`.
#[derive(Debug, Clone, Serialize)]
pub struct PcapReport {
    pub file: String,
    /// Frames the engine handed to the capture.
    pub frames_seen: u64,
    /// Frames in the file.
    pub frames_written: u64,
    /// Frames not in the file (the writer fell behind, or the file failed).
    pub frames_dropped: u64,
    /// Frames in the file cut to the snap length.
    pub frames_truncated: u64,
    pub error: Option<String>,
}

impl PcapReport {
    /// Finishes `cap` (after the engine has stopped) and reports.
    pub fn finish(cap: Capture) -> PcapReport {
        let file = cap.path().display().to_string();
        let CaptureStats {
            seen,
            written,
            dropped,
            truncated,
            error,
        } = cap.finish();
        PcapReport {
            file,
            frames_seen: seen,
            frames_written: written,
            frames_dropped: dropped,
            frames_truncated: truncated,
            error,
        }
    }

    /// One line for stderr.
    pub fn line(&self) -> String {
        let mut s = format!(
            "pcap: {} frames written to {}",
            self.frames_written, self.file
        );
        if self.frames_dropped > 0 {
            let why = if self.error.is_some() {
                "after the file failed, or the writer fell behind"
            } else {
                "the writer fell behind"
            };
            s.push_str(&format!(", {} DROPPED ({why})", self.frames_dropped));
        }
        if self.frames_truncated > 0 {
            s.push_str(&format!(", {} cut short", self.frames_truncated));
        }
        if let Some(e) = &self.error {
            s.push_str(&format!(", error: {e}"));
        }
        s
    }

    /// Whether the run should warn even with `--json`.
    pub fn incomplete(&self) -> bool {
        self.frames_dropped > 0 || self.error.is_some()
    }
}

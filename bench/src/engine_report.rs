//! The AF_XDP engine's counters at the end of a run, in the form every mode of iwarp-bench
//! reports them: a JSON object (`"engine"`) and one text line.

use datapath::engine::EngineCounters;
use serde::Serialize;

/// The engine's counters at the end of a run, as `--json` reports them under `"engine"` (and the
/// text line on stderr says them). Field names are stable (README, "iwarp-bench"): scripts read
/// them. Sums over every connection the engine ran; `held_*` are maxima.
#[derive(Debug, Clone, Serialize)]
pub struct EngineReport {
    /// Frames taken from the RX rings.
    pub frames_rx: u64,
    /// Packets put on the TX ring.
    pub frames_tx: u64,
    /// FPDUs received and processed in order.
    pub fpdus_rx: u64,
    /// FPDUs sent.
    pub fpdus_tx: u64,
    /// TCP segments with data passed up.
    pub segments_rx: u64,
    /// Of those, segments that arrived out of order.
    pub segments_out_of_order: u64,
    /// Payload octets handed to the queue pair in order.
    pub bytes_placed_in_order: u64,
    /// Payload octets placed ahead of the in-order point.
    pub bytes_placed_out_of_order: u64,
    /// FPDUs placed ahead of the in-order point.
    pub fpdus_placed_out_of_order: u64,
    /// Most octets the reassembly store held at once.
    pub held_peak_bytes: u64,
    /// Gaps with octets held at them at that peak.
    pub held_peak_gaps: u64,
    /// Most octets held at one gap.
    pub held_gap_peak_bytes: u64,
    /// Times a reassembly store's memory went back after it stayed empty for a second.
    pub reassembly_releases: u64,
    /// Times data out of order found the engine's reassembly budget spent and was given back
    /// to TCP for the peer to send again.
    pub reassembly_refusals: u64,
    /// Connections ended because data waited beyond a gap the peer never filled.
    pub held_timeouts: u64,
    /// Segments TCP retransmitted.
    pub retransmitted_segments: u64,
    /// TCP retransmission timeouts.
    pub rto_expirations: u64,
    /// TCP tail-loss probes.
    pub loss_probes: u64,
    /// TCP loss recoveries entered (congestion window reductions).
    pub fast_recoveries: u64,
    /// Congestion responses found spurious and undone.
    pub spurious_undone: u64,
    /// Segments dropped by PAWS.
    pub paws_drops: u64,
    /// Milliseconds in which TCP's unsent data waited for the peer's receive window (RFC 4898
    /// tcpEStatsPerfSndLimTimeRwin; summed over connections).
    pub send_limited_by_peer_window_ms: f64,
    /// Milliseconds in which it waited for the congestion window (SndLimTimeCwnd).
    pub send_limited_by_cwnd_ms: f64,
    /// Milliseconds with data in flight and nothing more to send: the application, or the
    /// engine's limit on data queued ahead of the acknowledged point (SndLimTimeSnd).
    pub send_limited_by_sender_ms: f64,
    /// FPDUs whose CRC did not match.
    pub crc_errors: u64,
    /// IFT: frames placed speculatively whose place the in-order framing confirmed.
    pub ift_speculation_confirmed: u64,
    /// IFT: frames not placed speculatively because they would write octets placed before.
    pub ift_speculation_refused: u64,
    /// IFT: speculative placements withdrawn (not confirmed, or beyond one that was not) and
    /// processed again in order.
    pub ift_speculation_withdrawn: u64,
    /// IFT: times TCP took octets back unacknowledged so that the peer resent them.
    pub ift_acks_withheld: u64,
    /// IFT: frames whose header CRC did not match.
    pub ift_header_crc_errors: u64,
    /// IFT: frames whose payload CRC did not match.
    pub ift_payload_crc_errors: u64,
    /// Terminate messages sent.
    pub terminates_sent: u64,
    /// Terminate messages received.
    pub terminates_received: u64,
    /// Connections that reached Full Operation.
    pub connections: u64,
    /// Engine turns run by the engine thread.
    pub turns_engine_thread: u64,
    /// Engine turns run by application threads (inline progress).
    pub turns_application: u64,
    /// Times the engine thread parked.
    pub parks: u64,
    /// Times a parked engine thread woke (each a context switch on the application's core).
    pub parked_wakes: u64,
    /// Of those, wakes by its watchdog (the application stopped polling with work pending).
    pub watchdog_wakes: u64,
    /// Milliseconds the engine thread waited (turns without work) while it had connections,
    /// summed over engine threads.
    pub idle_ms: f64,
    /// Engine threads (shards: one per queue, or 1).
    pub shards: u64,
    /// Every AF_XDP socket runs in zero-copy mode (false: copy mode, as on veth).
    pub zero_copy: bool,
    /// Where the steering XDP program runs: `driver` (native) or `generic` (`--xdp-mode`).
    pub xdp_mode: Option<String>,
    /// Segments a shard received for a flow another shard owns and handed over.
    pub handoffs: u64,
    /// Of those, dropped because the owner's inbox was full.
    pub handoff_drops: u64,
    /// Frames the kernel dropped before they reached an engine socket's RX ring (the ring or
    /// the fill ring was full or empty: an engine thread fell a whole RX frame pool behind).
    pub frames_dropped_by_kernel: u64,
    /// Packets received over several UMEM frames (multi-buffer AF_XDP at jumbo MTUs).
    pub multi_frame_rx: u64,
    /// Multi-frame packets dropped on receive (too many frames, or cut short).
    pub multi_frame_rx_dropped: u64,
    /// Packets sent over several UMEM frames.
    pub multi_frame_tx: u64,
    /// Descriptors the kernel handed back that name no frame of ours it held (received ones
    /// outside the RX pool, dropped unread with their packets; completions not taken back):
    /// zero unless the kernel or a stray write broke the rings.
    pub descriptors_refused: u64,
    /// The error that stopped the engine thread, if any.
    pub error: Option<String>,
}

impl EngineReport {
    /// The report of `c`, an engine's counters.
    pub fn new(c: &EngineCounters) -> Self {
        let (d, k) = (&c.driver, &c.conns);
        Self {
            frames_rx: d.rx_frames,
            frames_tx: d.tx_packets,
            fpdus_rx: k.fpdus_rx,
            fpdus_tx: k.fpdus_tx,
            segments_rx: k.segments,
            segments_out_of_order: k.segments_out_of_order,
            bytes_placed_in_order: k.bytes_placed_in_order,
            bytes_placed_out_of_order: k.bytes_placed_out_of_order,
            fpdus_placed_out_of_order: k.fpdus_placed_out_of_order,
            held_peak_bytes: k.held_peak,
            held_peak_gaps: k.held_peak_gaps,
            held_gap_peak_bytes: k.held_gap_peak,
            reassembly_releases: k.store_releases,
            reassembly_refusals: k.store_refusals,
            held_timeouts: k.held_timeouts,
            retransmitted_segments: k.retransmissions,
            rto_expirations: k.rto_expirations,
            loss_probes: k.loss_probes,
            fast_recoveries: k.fast_recoveries,
            spurious_undone: k.spurious_undone,
            paws_drops: k.paws_drops,
            send_limited_by_peer_window_ms: k.send_limited_ns[0] as f64 / 1e6,
            send_limited_by_cwnd_ms: k.send_limited_ns[1] as f64 / 1e6,
            send_limited_by_sender_ms: k.send_limited_ns[2] as f64 / 1e6,
            crc_errors: k.crc_errors,
            ift_speculation_confirmed: k.ift_speculation_confirmed,
            ift_speculation_refused: k.ift_speculation_refused,
            ift_speculation_withdrawn: k.ift_speculation_withdrawn,
            ift_acks_withheld: k.ift_acks_withheld,
            ift_header_crc_errors: k.ift_header_crc_errors,
            ift_payload_crc_errors: k.ift_payload_crc_errors,
            terminates_sent: k.terminates_sent,
            terminates_received: k.terminates_received,
            connections: c.established,
            turns_engine_thread: c.thread_turns,
            turns_application: c.app_turns,
            parks: c.parks,
            parked_wakes: c.parked_wakes,
            watchdog_wakes: c.watchdog_wakes,
            idle_ms: c.idle_ns as f64 / 1e6,
            shards: c.shards as u64,
            zero_copy: c.zero_copy,
            xdp_mode: c.xdp_mode.map(|m| m.to_string()),
            handoffs: c.driver.handoffs_out,
            handoff_drops: c.driver.handoff_drops,
            frames_dropped_by_kernel: c.driver.rx_kernel_drops,
            multi_frame_rx: c.driver.rx_multi_frame,
            multi_frame_rx_dropped: c.driver.rx_multi_frame_dropped,
            multi_frame_tx: c.driver.tx_multi_frame,
            descriptors_refused: c.driver.descs_refused,
            error: c.error.clone(),
        }
    }

    /// The one-line text form (stderr without `--json`).
    pub fn line(&self) -> String {
        format!(
            "engine counters: frames rx {} tx {} (dropped by the kernel before rx {}), FPDUs rx {} tx {}, \
             segments {} (out of order {}), placed in order {} B, out of order {} B \
             ({} FPDUs), held peak {} B at {} gaps, most held at one gap {} B, \
             retransmitted segments {} (timeouts {}, loss probes {}, recoveries {}, \
             undone as spurious {}), \
             sending limited by the peer's window {:.1} ms, the congestion window {:.1} ms, \
             the sender {:.1} ms, PAWS drops {}, CRC errors {}, \
             terminates sent {} received {}, connections {}, turns by the engine thread {} \
             by the application {} (engine parked {} times, woke {} times parked, {} by its watchdog, idle {:.1} ms), \
             engine threads {} \
             (segments handed between them {}, dropped {}), AF_XDP {}, XDP {} mode{}{}{}{}{}",
            self.frames_rx,
            self.frames_tx,
            self.frames_dropped_by_kernel,
            self.fpdus_rx,
            self.fpdus_tx,
            self.segments_rx,
            self.segments_out_of_order,
            self.bytes_placed_in_order,
            self.bytes_placed_out_of_order,
            self.fpdus_placed_out_of_order,
            self.held_peak_bytes,
            self.held_peak_gaps,
            self.held_gap_peak_bytes,
            self.retransmitted_segments,
            self.rto_expirations,
            self.loss_probes,
            self.fast_recoveries,
            self.spurious_undone,
            self.send_limited_by_peer_window_ms,
            self.send_limited_by_cwnd_ms,
            self.send_limited_by_sender_ms,
            self.paws_drops,
            self.crc_errors,
            self.terminates_sent,
            self.terminates_received,
            self.connections,
            self.turns_engine_thread,
            self.turns_application,
            self.parks,
            self.parked_wakes,
            self.watchdog_wakes,
            self.idle_ms,
            self.shards,
            self.handoffs,
            self.handoff_drops,
            if self.zero_copy { "zero-copy" } else { "copy mode" },
            self.xdp_mode.as_deref().unwrap_or("unknown"),
            if self.multi_frame_rx + self.multi_frame_tx + self.multi_frame_rx_dropped > 0 {
                format!(
                    ", multi-frame packets rx {} tx {} (dropped on receive {})",
                    self.multi_frame_rx, self.multi_frame_tx, self.multi_frame_rx_dropped
                )
            } else {
                String::new()
            },
            if self.reassembly_refusals + self.held_timeouts > 0 {
                format!(
                    ", out-of-order data given back for want of reassembly memory {} times, \
                     connections ended by a gap never filled {}",
                    self.reassembly_refusals, self.held_timeouts
                )
            } else {
                String::new()
            },
            if self.ift_speculation_confirmed
                + self.ift_speculation_refused
                + self.ift_speculation_withdrawn
                + self.ift_header_crc_errors
                + self.ift_payload_crc_errors
                > 0
            {
                format!(
                    ", IFT speculative placements confirmed {}, refused over written octets {}, \
                     withdrawn {} (ACKs withheld {}), header CRC errors {}, payload CRC errors {}",
                    self.ift_speculation_confirmed,
                    self.ift_speculation_refused,
                    self.ift_speculation_withdrawn,
                    self.ift_acks_withheld,
                    self.ift_header_crc_errors,
                    self.ift_payload_crc_errors
                )
            } else {
                String::new()
            },
            if self.descriptors_refused > 0 {
                format!(
                    ", ring descriptors refused as naming no frame the kernel held {}",
                    self.descriptors_refused
                )
            } else {
                String::new()
            },
            self.error
                .as_ref()
                .map(|e| format!(", stopped by: {e}"))
                .unwrap_or_default()
        )
    }
}

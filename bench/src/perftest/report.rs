//! What perftest prints, in its format strings, so that scripts written for its output read ours:
//! the header block (`ctx_print_test_info`), the result tables' column lines and rows
//! (perftest_parameters.h `RESULT_FMT*`, `REPORT_FMT*`), and the dashed separator.

use crate::cli::OutputKind;
use crate::stats::{BandwidthResult, LatencyResult};
use crate::TestKind;

use super::wire::BwReport;

/// `RESULT_LINE`: 87 dashes.
pub const RESULT_LINE: &str =
    "---------------------------------------------------------------------------------------";

/// `RESULT_FMT` / `RESULT_FMT_G` (`--report_gbits`).
pub fn bw_header(gbits: bool) -> &'static str {
    if gbits {
        " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]"
    } else {
        " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]"
    }
}

/// One row (`print_full_bw_report`): `REPORT_FMT`, or `REPORT_FMT_EXT` for a Gb/s average
/// below 0.1 (more decimals).
pub fn bw_row(r: &BwReport, gbits: bool) -> String {
    if gbits && r.bw_avg < 0.1 {
        format!(
            " {:<7}    {}           {:<7.6}            {:<7.6}            {:<7.6}",
            r.size, r.iters, r.bw_peak, r.bw_avg, r.msg_rate
        )
    } else {
        format!(
            " {:<7}    {:<10}       {:<7.2}            {:<7.2}\t\t   {:<7.6}",
            r.size, r.iters, r.bw_peak, r.bw_avg, r.msg_rate
        )
    }
}

/// A bandwidth result of ours as perftest's row: MB/s (2^20 octets) or, with `gbits`, Gb/s;
/// the peak column 0.00 where none was measured, as perftest's.
pub fn bw_row_of(r: &BandwidthResult, gbits: bool) -> String {
    let (avg, peak) = if gbits {
        (r.gbit_per_sec, r.peak_gbit_per_sec)
    } else {
        (r.mib_per_sec, r.peak_mib_per_sec)
    };
    bw_row(
        &BwReport {
            size: r.bytes,
            iters: r.iterations,
            bw_peak: peak.unwrap_or(0.0),
            bw_avg: avg,
            msg_rate: r.msg_rate_mpps,
        },
        gbits,
    )
}

/// A bandwidth result's line: perftest's row ([`bw_row_of`]), or with `--output` the one
/// number perftest's `print_full_bw_report` prints instead (`printf("%lf\n")`): the average
/// bandwidth in the row's unit, or the message rate in Mpps.
pub fn bw_line(r: &BandwidthResult, gbits: bool, output: Option<OutputKind>) -> String {
    match output {
        Some(OutputKind::Bandwidth) => {
            format!("{:.6}", if gbits { r.gbit_per_sec } else { r.mib_per_sec })
        }
        Some(OutputKind::MessageRate) => format!("{:.6}", r.msg_rate_mpps),
        _ => bw_row_of(r, gbits),
    }
}

/// `--output latency`: the average latency in microseconds as perftest's `print_report_lat`
/// (and `print_report_lat_duration`) prints it alone (`printf("%lf\n")`).
pub fn lat_number(t_avg_us: f64) -> String {
    format!("{t_avg_us:.6}")
}

/// `RESULT_FMT_LAT` as printed (with its trailing space).
pub const LAT_HEADER: &str = " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] ";

/// `REPORT_FMT_LAT`.
pub fn lat_row(r: &LatencyResult) -> String {
    format!(
        " {:<7} {}          {:<7.2}        {:<7.2}      {:<7.2}  \t       {:<7.2}     \t{:<7.2}\t\t{:<7.2} \t\t{:<7.2}",
        r.bytes,
        r.iterations,
        r.t_min_us,
        r.t_max_us,
        r.t_typical_us,
        r.t_avg_us,
        r.t_stdev_us,
        r.p99_us,
        r.p99_9_us
    )
}

/// `RESULT_FMT_LAT_DUR`: the columns of a latency test run with `-D`.
pub const LAT_DUR_HEADER: &str = " #bytes        #iterations       t_avg[usec]    tps average";

/// `REPORT_FMT_LAT_DUR` (`print_report_lat_duration`): a latency test run with `-D`, its
/// operations in the sampling window, their average time and rate.
pub fn lat_dur_row(bytes: u64, iterations: u64, t_avg_us: f64, tps: f64) -> String {
    format!(" {bytes:<7}       {iterations}            {t_avg_us:<7.2}        {tps:<7.2}")
}

/// What the header block shows of a run.
pub struct Header<'a> {
    pub test: TestKind,
    pub server: bool,
    pub bidirectional: bool,
    pub qps: u64,
    pub tx_depth: u64,
    pub rx_depth: u64,
    /// One work request in this many is signaled (perftest mode signals every one: 1).
    pub cq_mod: u64,
    /// Work requests per posted list (`-l`; 1: no lists).
    pub post_list: u64,
    /// `-I`: the most octets a Send or Write carries inline (0: none).
    pub inline: u64,
    pub out_reads: u16,
    /// The MTU line's value, in octets: in perftest mode the MTU we offer in perftest's
    /// exchange, in iwarp-bench the connection's MULPDU (the largest DDP segment).
    pub mtu: u32,
    /// Ours: the transport (and interface), in place of an RDMA device name.
    pub device: &'a str,
}

/// `ctx_print_test_info` for an iWARP RC run connected by rdma_cm (`-R`), framed by result
/// lines, with the server's "waiting" note inside as perftest prints it.
pub fn header_block(h: &Header) -> Vec<String> {
    let verb = match h.test {
        TestKind::SendBw | TestKind::SendLat => "Send",
        TestKind::ReadBw | TestKind::ReadLat => "RDMA_Read",
        TestKind::WriteBw | TestKind::WriteLat => "RDMA_Write",
        TestKind::AtomicBw | TestKind::AtomicLat => "Atomic",
    };
    let bw = h.test.is_bw();
    let kind = match (bw, h.bidirectional, h.post_list > 1) {
        (true, true, true) => "Bidirectional Post List BW ",
        (true, true, false) => "Bidirectional BW ",
        (true, false, true) => "Post List BW ",
        (true, false, false) => "BW ",
        (false, ..) => "Latency ",
    };
    let send = matches!(h.test, TestKind::SendBw | TestKind::SendLat);
    let read = matches!(h.test, TestKind::ReadBw | TestKind::ReadLat);
    let mut out = vec![
        RESULT_LINE.to_string(),
        format!("                    {verb} {kind}Test"),
        format!(" Dual-port       : OFF\t\tDevice         : {}", h.device),
        format!(" Number of qps   : {}\t\tTransport type : IW", h.qps),
        " Connection type : RC\t\tUsing SRQ      : OFF".to_string(),
        " PCIe relax order: Unsupported".to_string(),
        " ibv_wr* API     : OFF".to_string(),
    ];
    if !h.server || h.bidirectional {
        out.push(format!(" TX depth        : {}", h.tx_depth));
    }
    if h.post_list > 1 {
        out.push(format!(" Post List       : {}", h.post_list));
    }
    if send && (h.server || h.bidirectional) {
        out.push(format!(" RX depth        : {}", h.rx_depth));
    }
    if bw {
        out.push(format!(" CQ Moderation   : {}", h.cq_mod));
    }
    out.push(format!(" Mtu             : {}[B]", h.mtu));
    out.push(" Link type       : Ethernet".to_string());
    out.push(" GID index       : 0".to_string());
    if read {
        out.push(format!(" Outstand reads  : {}", h.out_reads));
    } else {
        out.push(format!(" Max inline data : {}[B]", h.inline));
    }
    out.push(" rdma_cm QPs\t : ON".to_string());
    out.push(" Data ex. method : rdma_cm".to_string());
    if h.server {
        out.push(RESULT_LINE.to_string());
        out.push(" Waiting for client rdma_cm QP to connect".to_string());
        out.push(" Please run the same command with the IB/RoCE interface IP".to_string());
    }
    out.push(RESULT_LINE.to_string());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// perftest 6.06's lines for a 65536-octet write-bw row, MB/s and Gb/s, printed by its C
    /// format strings (`REPORT_FMT`): the same octets.
    #[test]
    fn rows_match_perftests_format_strings() {
        let r = BwReport {
            size: 65536,
            iters: 5000,
            bw_peak: 1090.12,
            bw_avg: 1088.5,
            msg_rate: 0.017416,
        };
        assert_eq!(
            bw_row(&r, false),
            " 65536      5000             1090.12            1088.50\t\t   0.017416"
        );
        let small = BwReport {
            size: 2,
            iters: 20,
            bw_peak: 0.0,
            bw_avg: 0.0123,
            msg_rate: 0.5,
        };
        assert_eq!(
            bw_row(&small, true),
            " 2          20           0.000000            0.012300            0.500000"
        );
        assert_eq!(RESULT_LINE.len(), 87);
    }

    /// `--output`: the average in the row's unit or the message rate, as C's `%lf` (six
    /// decimals); the row otherwise, its peak 0.00 where none was measured.
    #[test]
    fn output_numbers_and_the_peak_column() {
        let r = BandwidthResult::new(65536, 1000, 0.5);
        assert_eq!(
            bw_line(&r, false, Some(OutputKind::Bandwidth)),
            "125.000000"
        );
        assert_eq!(bw_line(&r, true, Some(OutputKind::Bandwidth)), "1.048576");
        assert_eq!(
            bw_line(&r, false, Some(OutputKind::MessageRate)),
            "0.002000"
        );
        assert_eq!(lat_number(2.5), "2.500000");
        let row = bw_line(&r, false, None);
        assert_eq!(
            row,
            " 65536      1000             0.00               125.00 \t\t   0.002000"
        );
        // A peak of 1000 messages in 0.25 s: 250 MiB/s, 2.097152 Gb/s.
        let peaked = r.clone().with_peak(Some(0.25 / 1000.0));
        assert!(bw_row_of(&peaked, false).contains(" 250.00             125.00"));
        assert!(bw_row_of(&peaked, true).contains(" 2.10               1.05"));
    }

    /// perftest 6.06's `-D` latency lines (`RESULT_FMT_LAT_DUR`, `REPORT_FMT_LAT_DUR` as C's
    /// printf writes them).
    #[test]
    fn latency_duration_row_as_perftest_prints_it() {
        assert_eq!(
            LAT_DUR_HEADER,
            " #bytes        #iterations       t_avg[usec]    tps average"
        );
        assert_eq!(
            lat_dur_row(2, 1234567, 4.126, 242424.2424),
            " 2             1234567            4.13           242424.24"
        );
        assert_eq!(
            lat_dur_row(65536, 80, 123.4, 8.1),
            " 65536         80            123.40         8.10   "
        );
    }

    #[test]
    fn header_block_of_a_write_bw_client() {
        let h = Header {
            test: TestKind::WriteBw,
            server: false,
            bidirectional: false,
            qps: 1,
            tx_depth: 128,
            rx_depth: 1,
            cq_mod: 1,
            post_list: 1,
            inline: 0,
            out_reads: 128,
            mtu: 4096,
            device: "socket",
        };
        let b = header_block(&h);
        assert_eq!(b[1], "                    RDMA_Write BW Test");
        assert!(b.contains(&" Number of qps   : 1\t\tTransport type : IW".to_string()));
        assert!(b.contains(&" TX depth        : 128".to_string()));
        assert!(b.contains(&" Data ex. method : rdma_cm".to_string()));
        assert!(b.contains(&" Max inline data : 0[B]".to_string()));
        assert_eq!(b.first(), b.last());
        let inline = header_block(&Header { inline: 64, ..h });
        assert!(inline.contains(&" Max inline data : 64[B]".to_string()));
    }
}

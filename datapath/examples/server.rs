//! An iWARP server over either transport: registers a buffer it allocated itself, tells the
//! client where it is (private data of the MPA Reply), lets the client RDMA Write into it and
//! RDMA Read from it, and waits for the client's Send.
//!
//! ```text
//! cargo run -p datapath --example server -- 127.0.0.1:7471            # socket transport
//! sudo cargo run -p datapath --example server -- --xdp eth1 0.0.0.0:7471  # AF_XDP engine
//! ```
//! Then run the `client` example against it. The server prints `listening on ADDR` first.

use std::net::SocketAddr;
use std::time::Duration;

use datapath::engine::XdpEngineConfig;
use datapath::{
    Access, CompletionQueue, ConnectParams, Device, IdleQp, ProtectionDomain, RecvWr, Transport,
    WcOpcode, WcStatus,
};

const LEN: usize = 1 << 20;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (device, addr) = match args.as_slice() {
        [flag, ifname, addr] if flag == "--xdp" => (
            Device::open(Transport::Xdp {
                ifname: ifname.clone(),
                config: Box::new(XdpEngineConfig::default()),
            })?,
            addr,
        ),
        [addr] => (Device::socket(), addr),
        _ => return Err("usage: server [--xdp IFACE] ADDR:PORT".into()),
    };
    let addr: SocketAddr = addr.parse()?;
    let listener = device.listen(addr, ConnectParams::default())?;
    println!("listening on {}", listener.local_addr()?);

    // Our own memory: the client writes into it and reads from it.
    let pd = ProtectionDomain::new();
    let cq = CompletionQueue::new();
    let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let mr = pd.register_buffer(vec![0u8; LEN], access)?;
    let inbox = pd.register_buffer(vec![0u8; 4096], Access::LOCAL_WRITE)?;

    let request = listener.accept()?;
    println!("connection request from {}", request.peer_addr());
    // Where the client may write and read: STag, TO, length.
    let mut welcome = Vec::new();
    welcome.extend_from_slice(&mr.stag().0.to_be_bytes());
    welcome.extend_from_slice(&mr.base_to().to_be_bytes());
    welcome.extend_from_slice(&(LEN as u64).to_be_bytes());
    // As verbs does it: create the queue pair (`rdma_create_qp`), post its receive
    // (`ibv_post_recv`: iWARP has no receiver-not-ready retry, so before accepting), accept.
    let idle = IdleQp::new(&pd, &cq, &ConnectParams::default())?;
    idle.post_recv(RecvWr {
        wr_id: 1,
        sg_list: inbox.sge(0, 4096).into(),
    })?;
    let conn = request.accept_qp(idle, &welcome)?;
    let qp = conn.qp;

    // The client's Send comes after its Write and Read on the same stream.
    let c = cq
        .wait(Duration::from_secs(30))
        .ok_or("no Send from the client")?;
    if c.wc.status != WcStatus::Success || c.wc.opcode != WcOpcode::Recv {
        return Err(format!("unexpected completion {c:?}: {:?}", qp.status().error).into());
    }
    // A copy: the client may Write into `mr` at any time (REMOTE_WRITE), whatever it said,
    // so no slice of it may be held while the connection lives.
    let mut written = vec![0u8; LEN];
    mr.read(0, &mut written);
    let n = written.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
    // SAFETY: the receive completed; nothing else lands in `inbox`.
    let message = unsafe { &inbox.as_slice()[..c.wc.byte_len as usize] };
    println!(
        "client wrote {n} bytes starting {:?}; its Send says {:?}",
        String::from_utf8_lossy(&written[..n.min(32)]),
        String::from_utf8_lossy(message)
    );
    qp.wait_finished(Duration::from_secs(10));
    qp.disconnect();
    if let Some(counters) = device.close() {
        println!(
            "engine: {} FPDUs sent, {} received",
            counters.conns.fpdus_tx, counters.conns.fpdus_rx
        );
    }
    println!("server done");
    Ok(())
}

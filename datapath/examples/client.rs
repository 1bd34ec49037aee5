//! An iWARP client over either transport: connects to the `server` example, RDMA Writes a
//! message into the server's buffer, RDMA Reads it back, checks it, and Sends a note. With
//! `--epoll` it waits for completions in `epoll(7)` on a completion channel's descriptor
//! instead of blocking in `CompletionQueue::wait` (the way an event loop, mio or tokio's
//! `AsyncFd` would).
//!
//! ```text
//! cargo run -p datapath --example client -- [--epoll] 127.0.0.1:7471
//! sudo cargo run -p datapath --example client -- --xdp eth1 10.0.0.1:7471
//! ```

use std::os::fd::AsRawFd;
use std::time::Duration;

use datapath::engine::XdpEngineConfig;
use datapath::{
    Access, Completion, CompletionChannel, CompletionQueue, ConnectParams, Device,
    ProtectionDomain, SendOp, SendWr, Stag, Transport, WcStatus,
};

const MESSAGE: &[u8] = b"written by RDMA Write, read back by RDMA Read";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let epoll = args.first().is_some_and(|a| a == "--epoll");
    if epoll {
        args.remove(0);
    }
    let (device, addr) = match args.as_slice() {
        [flag, ifname, addr] if flag == "--xdp" => (
            Device::open(Transport::Xdp {
                ifname: ifname.clone(),
                config: Box::new(XdpEngineConfig::default()),
            })?,
            addr.parse()?,
        ),
        [addr] => (Device::socket(), addr.parse()?),
        _ => return Err("usage: client [--epoll] [--xdp IFACE] ADDR:PORT".into()),
    };
    let pd = ProtectionDomain::new();
    let channel = CompletionChannel::new()?;
    let cq = CompletionQueue::with_channel(&channel);
    // Our own memory for the source, the Read's sink and the note.
    let src = pd.register_buffer(MESSAGE.to_vec(), Access::NONE)?;
    let sink = pd.register_buffer(vec![0u8; MESSAGE.len()], Access::LOCAL_WRITE)?;
    let note = pd.register_buffer(b"done, thanks".to_vec(), Access::NONE)?;

    let conn = device.connect(addr, &pd, &cq, &ConnectParams::default(), b"hello")?;
    let w = conn.private_data.as_slice();
    if w.len() != 20 {
        return Err("the server's reply carries no buffer".into());
    }
    let stag = Stag(u32::from_be_bytes(w[0..4].try_into()?));
    let to = u64::from_be_bytes(w[4..12].try_into()?);
    let qp = conn.qp;
    let post = |wr_id, op, sg_list| {
        qp.post_send(SendWr {
            wr_id,
            op,
            sg_list,
            signaled: true,
            fence: false,
        })
    };
    let write = SendOp::Write {
        remote_stag: stag,
        remote_to: to,
    };
    let read = SendOp::Read {
        remote_stag: stag,
        remote_to: to,
    };
    let send = SendOp::Send {
        solicited: true,
        invalidate: None,
    };
    post(1, write, src.sge(0, MESSAGE.len() as u32).into())?;
    post(2, read, sink.sge(0, MESSAGE.len() as u32).into())?;
    for wr_id in [1, 2] {
        let c = next(&cq, &channel, epoll)?;
        if c.wc.status != WcStatus::Success || c.wc.wr_id != wr_id {
            return Err(format!("{c:?}: {:?}", qp.status().error).into());
        }
    }
    // SAFETY: the Read completed; nothing else writes `sink`.
    let got = unsafe { sink.as_slice() };
    if got != MESSAGE {
        return Err("the Read brought back other bytes".into());
    }
    println!("read back {:?}", String::from_utf8_lossy(got));
    post(3, send, note.sge(0, note.len() as u32).into())?;
    let c = next(&cq, &channel, epoll)?;
    if c.wc.status != WcStatus::Success {
        return Err(format!("{c:?}").into());
    }
    drop(qp);
    device.close();
    println!("client done{}", if epoll { " (epoll)" } else { "" });
    Ok(())
}

/// The next completion: blocking in the queue, or arming it and sleeping in epoll on the
/// channel's descriptor until the completion arrives.
fn next(
    cq: &CompletionQueue,
    channel: &CompletionChannel,
    epoll: bool,
) -> Result<Completion, Box<dyn std::error::Error>> {
    let timeout = Duration::from_secs(30);
    if !epoll {
        return Ok(cq.wait(timeout).ok_or("no completion")?);
    }
    loop {
        // Arm first, then look: a completion that came in between is found by the look.
        cq.req_notify(false)?;
        if let Some(c) = cq.try_next() {
            return Ok(c);
        }
        if !wait_readable(channel.as_raw_fd(), timeout)? {
            return Err("no completion".into());
        }
        channel.get_event();
    }
}

/// Sleeps in epoll until `fd` is readable; false on timeout.
fn wait_readable(fd: i32, timeout: Duration) -> std::io::Result<bool> {
    // SAFETY: plain epoll system calls on a descriptor we own and one we create and close;
    // the event structures live on our stack.
    unsafe {
        let ep = libc::epoll_create1(libc::EPOLL_CLOEXEC);
        if ep < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: 0,
        };
        libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, fd, &mut ev);
        let n = libc::epoll_wait(ep, &mut ev, 1, timeout.as_millis() as i32);
        libc::close(ep);
        Ok(n == 1)
    }
}

//! The completion channel (`ibv_comp_channel` + `ibv_req_notify_cq`): an application waits in
//! epoll on the channel's descriptor and wakes on a completion, not before; a solicited-only
//! arming wakes only on a Send with Solicited Event (RFC 5040 5.3) or a failed work request.
//! Socket transport on loopback.

mod common;

use std::os::fd::AsRawFd;
use std::time::Duration;

use common::*;
use datapath::{
    Access, CompletionChannel, CompletionQueue, Listener, RecvWr, SendOp, SendWr, WcOpcode,
    WcStatus,
};

/// An epoll instance watching one descriptor for input.
struct Epoll(i32);

impl Epoll {
    fn watching(fd: i32) -> Epoll {
        // SAFETY: plain system calls on descriptors this test owns; the event is on our stack.
        unsafe {
            let ep = libc::epoll_create1(libc::EPOLL_CLOEXEC);
            assert!(ep >= 0, "epoll_create1");
            let mut ev = libc::epoll_event {
                events: libc::EPOLLIN as u32,
                u64: 7,
            };
            assert_eq!(libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, fd, &mut ev), 0);
            Epoll(ep)
        }
    }

    /// True if the descriptor became readable within `timeout`.
    fn wait(&self, timeout: Duration) -> bool {
        let mut ev = libc::epoll_event { events: 0, u64: 0 };
        // SAFETY: one event slot on our stack, count 1.
        let n = unsafe { libc::epoll_wait(self.0, &mut ev, 1, timeout.as_millis() as i32) };
        assert!(n >= 0, "epoll_wait");
        n == 1 && ev.u64 == 7
    }
}

impl Drop for Epoll {
    fn drop(&mut self) {
        // SAFETY: closes the epoll descriptor this value owns.
        unsafe { libc::close(self.0) };
    }
}

fn send_wr(wr_id: u64, mr: &datapath::MemoryRegion, len: u32, solicited: bool) -> SendWr {
    SendWr {
        wr_id,
        op: SendOp::Send {
            solicited,
            invalidate: None,
        },
        sg_list: mr.sge(0, len).into(),
        signaled: true,
        fence: false,
    }
}

const QUIET: Duration = Duration::from_millis(300);

#[test]
fn epoll_wakes_on_a_completion_and_solicited_only_on_a_solicited_send() {
    let channel = CompletionChannel::new().unwrap();
    let server = Side {
        pd: Default::default(),
        cq: CompletionQueue::with_channel(&channel),
    };
    let client = Side::new();
    let listener = Listener::bind(any_port(), params(mpa(1, true, false))).unwrap();
    let (c, s) = establish_ok(
        &listener,
        &client,
        &params(mpa(1, true, false)),
        ServerPlan {
            side: &server,
            private_data: &[],
            recvs: vec![],
        },
    );
    let src = client.pd.register(4096, Access::NONE).unwrap();
    let sink = server.pd.register(4 * 4096, Access::LOCAL_WRITE).unwrap();
    for i in 0..4 {
        s.qp.post_recv(RecvWr {
            wr_id: 100 + i,
            sg_list: sink.sge(i as usize * 4096, 4096).into(),
        })
        .unwrap();
    }
    let ep = Epoll::watching(channel.as_raw_fd());

    // A queue without a channel is armed as verbs arms it (nothing to deliver to): no
    // error, and no event anywhere.
    client
        .cq
        .req_notify(false)
        .expect("arming a queue without a channel");

    // Armed for any completion: nothing is readable before the Send arrives.
    server.cq.req_notify(false).unwrap();
    assert!(!ep.wait(QUIET), "woke with no completion");
    assert!(channel.get_event().is_none());
    c.qp.post_send(send_wr(1, &src, 100, false)).unwrap();
    assert!(ep.wait(WAIT), "no wake-up for the completion");
    let cq = channel.get_event().expect("an event after the wake-up");
    assert!(cq.same_queue(&server.cq));
    assert!(channel.get_event().is_none(), "one arming, one event");
    let wc = cq.try_next().expect("the completion that fired");
    assert_eq!((wc.wc.wr_id, wc.wc.opcode), (100, WcOpcode::Recv));
    expect_wc(&client.cq, 1, WcOpcode::Send, WcStatus::Success);

    // Not armed: a completion makes nothing readable.
    c.qp.post_send(send_wr(2, &src, 100, false)).unwrap();
    expect_wc(&server.cq, 101, WcOpcode::Recv, WcStatus::Success);
    assert!(!ep.wait(QUIET), "woke while not armed");

    // Solicited only: an unsolicited Send does not wake, a Send with SE does.
    server.cq.req_notify(true).unwrap();
    c.qp.post_send(send_wr(3, &src, 10, false)).unwrap();
    expect_wc(&client.cq, 2, WcOpcode::Send, WcStatus::Success);
    expect_wc(&client.cq, 3, WcOpcode::Send, WcStatus::Success);
    assert!(!ep.wait(QUIET), "woke on an unsolicited Send");
    let plain = next_wc(&server.cq, "the unsolicited Send");
    assert_eq!((plain.wc.wr_id, plain.wc.solicited), (102, false));
    c.qp.post_send(send_wr(4, &src, 10, true)).unwrap();
    assert!(ep.wait(WAIT), "no wake-up for the solicited Send");
    assert!(channel.wait_event(WAIT).is_some());
    let se = next_wc(&server.cq, "the solicited Send");
    assert_eq!((se.wc.wr_id, se.wc.solicited), (103, true));
    assert!(!ep.wait(QUIET), "the event was taken: nothing readable");
}

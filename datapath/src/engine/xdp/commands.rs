//! The messages of setup calls: the commands application threads hand an engine thread
//! ([`EngineCmd`]: listen, connect, accept, reject, shutdown), the one-shot channels that answer
//! them ([`Reply`], [`Handover`] for the queue pairs of connect and accept and for a listen's port) and the MPA Requests an engine thread passes to a listener ([`RequestMsg`]).

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use mpa::RequestInfo;

use crate::memory::ProtectionDomain;
use crate::verbs::cm::{ConnectParams, ListenRecord};
use crate::verbs::cq::CqSink;
use crate::verbs::qp::{QpParts, QpStart};
use crate::xdp_tcp::ConnId;
use crate::xsk::{Route, XskError};
use crate::DatapathError;

pub(super) type Reply<T> = Sender<Result<T, DatapathError>>;

/// Waiting for the outcome ([`HANDOVER_WAITING`]), delivered by the engine, or given up by
/// the caller: one compare-and-swap decides between the last two.
const HANDOVER_WAITING: u8 = 0;
const HANDOVER_DELIVERED: u8 = 1;
const HANDOVER_ABANDONED: u8 = 2;

/// The engine's end of a connect's, an accept's or a listen's outcome: a queue pair (or a
/// listening port) that must not be lost between a caller that gives up waiting and an engine
/// that delivers at that very moment. Either the engine delivers and the caller receives it
/// (even just after its time ran out), or the caller gave up first and [`Handover::deliver`]
/// says so, so that the engine undoes it itself (drops the connection, reporting nothing of it
/// to the caller's completion queue; stops listening).
pub(super) struct Handover<T> {
    tx: Sender<Result<T, DatapathError>>,
    state: Arc<AtomicU8>,
}

/// The caller's end of a [`Handover`].
pub(super) struct HandoverWait<T> {
    rx: Receiver<Result<T, DatapathError>>,
    state: Arc<AtomicU8>,
}

/// A connected pair of a [`Handover`] and its [`HandoverWait`].
pub(super) fn handover<T>() -> (Handover<T>, HandoverWait<T>) {
    let (tx, rx) = crossbeam_channel::bounded(1);
    let state = Arc::new(AtomicU8::new(HANDOVER_WAITING));
    (
        Handover {
            tx,
            state: state.clone(),
        },
        HandoverWait { rx, state },
    )
}

impl<T> Handover<T> {
    /// Delivers `outcome`; false if the caller had given up (then nobody has it).
    pub(super) fn deliver(self, outcome: Result<T, DatapathError>) -> bool {
        let committed = self
            .state
            .compare_exchange(
                HANDOVER_WAITING,
                HANDOVER_DELIVERED,
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok();
        // The caller, once it sees DELIVERED, waits for this send; a receiver gone (the
        // caller's thread died) loses only what nobody could take.
        committed && self.tx.send(outcome).is_ok()
    }
}

impl<T> HandoverWait<T> {
    /// Waits up to `timeout` for the outcome. Giving up is a compare-and-swap: if the engine
    /// committed to delivering first, its outcome is waited for and returned.
    pub(super) fn wait(self, timeout: Duration, what: &'static str) -> Result<T, DatapathError> {
        match self.rx.recv_timeout(timeout) {
            Ok(r) => r,
            Err(RecvTimeoutError::Disconnected) => Err(DatapathError::Disconnected),
            Err(RecvTimeoutError::Timeout) => {
                let gave_up = self
                    .state
                    .compare_exchange(
                        HANDOVER_WAITING,
                        HANDOVER_ABANDONED,
                        Ordering::AcqRel,
                        Ordering::Acquire,
                    )
                    .is_ok();
                if gave_up {
                    return Err(DatapathError::Timeout(what));
                }
                // Delivered: the send follows the swap at once (or the engine's end is gone).
                self.rx.recv().unwrap_or(Err(DatapathError::Disconnected))
            }
        }
    }
}

pub(super) struct RequestMsg {
    pub(super) id: ConnId,
    /// The MPA Request; `None` for an IFT phase 0 adaption indication.
    pub(super) info: Option<RequestInfo>,
    pub(super) peer: SocketAddr,
    /// The shard whose connection it is.
    pub(super) shard: usize,
}

pub(super) enum EngineCmd {
    Listen {
        port: u16,
        params: ConnectParams,
        requests: Sender<RequestMsg>,
        record: Arc<ListenRecord>,
        /// The port listened on (the one the kernel picked for port 0). A handover: a caller
        /// that gave up (its `setup_timeout` passed) leaves the engine to stop listening
        /// again, or the port stayed taken for the engine's life.
        reply: Handover<u16>,
    },
    /// The listener on `port` was dropped: stop listening (no reply).
    Unlisten {
        port: u16,
    },
    Connect(Box<ConnectCmd>),
    /// `rdma_resolve_addr`'s check, in the engine's network namespace: the kernel's route to
    /// `dst` leaves through the engine's interface.
    RouteCheck {
        dst: Ipv4Addr,
        reply: Reply<()>,
    },
    /// `rdma_resolve_route`: the next hop's MAC address towards `dst` resolved through the
    /// kernel's neighbour table, in the engine's network namespace, off the engine thread.
    ResolveRoute {
        dst: Ipv4Addr,
        done: RouteDone,
    },
    Accept {
        id: ConnId,
        pd: ProtectionDomain,
        cq: CqSink,
        private_data: Vec<u8>,
        start: QpStart,
        params: ConnectParams,
        reply: Handover<QpParts>,
    },
    Reject {
        id: ConnId,
        private_data: Vec<u8>,
        reply: Reply<()>,
    },
    Shutdown,
    /// Makes the engine thread panic in its turn (tests of the failure path).
    Panic,
}

/// A connect's command: the MPA Initiator to start towards `addr`, and where its outcome goes.
pub(super) struct ConnectCmd {
    pub(super) addr: SocketAddrV4,
    pub(super) pd: ProtectionDomain,
    pub(super) cq: CqSink,
    pub(super) params: ConnectParams,
    pub(super) private_data: Vec<u8>,
    pub(super) start: QpStart,
    /// When the caller's `setup_timeout` ends: next-hop resolution, TCP's handshake and the
    /// MPA exchange must be done by then (the engine fails the connect itself at this time,
    /// and the caller waits a little longer for that outcome).
    pub(super) deadline: Instant,
    pub(super) reply: Handover<(QpParts, Vec<u8>)>,
}

/// Told the outcome of a route's resolution (`rdma_resolve_route`) exactly once: by
/// [`RouteDone::tell`], or, dropped untold (the engine stopped or failed with the command or
/// its resolution under way), with [`DatapathError::Disconnected`], so that the application
/// waiting for its event always has one.
pub(super) struct RouteDone(Option<Box<TellRoute>>);

/// What [`RouteDone`] calls.
type TellRoute = dyn FnOnce(Result<(), DatapathError>) + Send;

impl RouteDone {
    pub(super) fn new(done: impl FnOnce(Result<(), DatapathError>) + Send + 'static) -> Self {
        RouteDone(Some(Box::new(done)))
    }

    /// Tells the outcome.
    pub(super) fn tell(mut self, outcome: Result<(), DatapathError>) {
        if let Some(done) = self.0.take() {
            done(outcome);
        }
    }
}

impl Drop for RouteDone {
    fn drop(&mut self) {
        if let Some(done) = self.0.take() {
            done(Err(DatapathError::Disconnected));
        }
    }
}

/// What waits for a next hop's resolution.
pub(super) enum Awaiting {
    /// A connect, started once its next hop is known.
    Connect(Box<ConnectCmd>),
    /// A route resolution towards `dst`, told its outcome.
    Route { dst: Ipv4Addr, done: RouteDone },
}

/// Connects and route resolutions waiting for their next hop's MAC address, each resolved on
/// a thread of its own (the kernel's ARP may take seconds; the engine's turns go on meanwhile).
/// What waits stays here, not with the thread: an engine that stops drops it, and its caller
/// learns at once (not when the resolution's wait ends).
pub(super) struct Resolutions {
    pub(super) tx: Sender<Resolved>,
    pub(super) rx: Receiver<Resolved>,
    /// What waits, by the number its resolution thread answers with.
    pub(super) waiting: HashMap<u64, Awaiting>,
    /// The number the next resolution gets.
    pub(super) next: u64,
}

/// A resolution's number, and its next hop resolved (the route taken, its MAC) or not.
pub(super) type Resolved = (u64, Result<(Route, [u8; 6]), XskError>);

impl Resolutions {
    pub(super) fn new() -> Self {
        let (tx, rx) = crossbeam_channel::unbounded();
        Resolutions {
            tx,
            rx,
            waiting: HashMap::new(),
            next: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_delivered_outcome_is_received() {
        let (tx, rx) = handover::<u32>();
        assert!(tx.deliver(Ok(7)));
        assert_eq!(rx.wait(Duration::from_secs(1), "test").ok(), Some(7));
    }

    #[test]
    fn a_caller_that_gave_up_is_not_delivered_to() {
        let (tx, rx) = handover::<u32>();
        assert!(matches!(
            rx.wait(Duration::from_millis(1), "test"),
            Err(DatapathError::Timeout("test"))
        ));
        assert!(!tx.deliver(Ok(7)), "delivered to a caller that gave up");
    }

    /// The engine committed to delivering (its swap done, its send not yet) when the caller's
    /// time ran out: the caller waits for the send and has the outcome, late, instead of
    /// leaving it to be dropped unreceived.
    #[test]
    fn a_delivery_committed_before_the_timeout_is_waited_for() {
        let (tx, rx) = handover::<u32>();
        tx.state.store(HANDOVER_DELIVERED, Ordering::Release);
        let engine = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            tx.tx.send(Ok(7)).is_ok()
        });
        assert_eq!(rx.wait(Duration::from_millis(1), "test").ok(), Some(7));
        assert!(engine.join().expect("engine thread"));
    }

    /// Deliveries racing the caller's timeout: whatever the timing, either the engine's
    /// deliver says it was taken and the caller has it, or it says not and the caller timed
    /// out; never an outcome delivered and lost, nor one received and reported not taken.
    /// (Which of the two happens depends on the machine; the committed-then-timed-out case is
    /// the test above.)
    #[test]
    fn a_delivery_racing_the_timeout_is_never_lost() {
        for round in 0..2000u32 {
            let (tx, rx) = handover::<u32>();
            let engine = std::thread::spawn(move || {
                for _ in 0..(round % 64) * 16 {
                    std::hint::spin_loop();
                }
                tx.deliver(Ok(round))
            });
            let got = rx.wait(Duration::from_micros(u64::from(round % 200)), "test");
            let delivered = engine.join().expect("engine thread");
            match (delivered, got) {
                (true, Ok(v)) => assert_eq!(v, round),
                (false, Err(DatapathError::Timeout(_))) => {}
                (d, g) => panic!("round {round}: delivered {d}, caller got {g:?}"),
            }
        }
    }
}

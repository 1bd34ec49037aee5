// SPDX-License-Identifier: MIT OR Apache-2.0
//
// XDP steering program for the iWARP kernel-bypass data path.
//
// Redirects IPv4 TCP packets that belong to iWARP into the AF_XDP socket bound
// to the packet's RX queue; everything else goes to the kernel unchanged.
//
// A packet is steered when
//   * its TCP destination port is a key of `steer_ports` (listeners), or
//   * its 4-tuple {saddr, daddr, sport, dport} is a key of `steer_flows`
//     (established connections).
// All keys are in network byte order, exactly as they appear on the wire.
//
// A steered packet goes to `xsks[ctx->rx_queue_index]` through
// bpf_redirect_map(..., XDP_PASS): when no AF_XDP socket is bound to that
// queue the kernel gets the packet (and will answer a SYN with a RST).
//
// Not steered (XDP_PASS): non-IPv4 (ARP, IPv6), VLAN-tagged frames, IPv4
// fragments, non-TCP, malformed or truncated headers.
//
// Counters (`counters`, PERCPU_ARRAY, one u64 per CPU per slot; every packet is
// counted in exactly one slot):
//   0 = redirected into an AF_XDP socket,
//   1 = passed to the kernel because it is not steered,
//   2 = steered but no AF_XDP socket bound to its RX queue (passed to the kernel).
//
// Two entry points share the code: `steer` (SEC "xdp") and `steer_frags`
// (SEC "xdp.frags", multi-buffer aware, needed for native XDP on veth when the
// peer MTU is above 3506). Headers are only read from the first buffer, which
// always holds them.

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/tcp.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#define COUNTER_REDIRECTED 0
#define COUNTER_PASSED 1
#define COUNTER_NO_SOCKET 2
#define COUNTER_SLOTS 3

// Must match `MAX_QUEUES` in src/lib.rs.
#define MAX_QUEUES 64

// 12 octets, no padding; must match `FlowKey` in src/lib.rs.
struct flow_key {
	__be32 saddr;
	__be32 daddr;
	__be16 sport;
	__be16 dport;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, __u16); // TCP destination port, network byte order
	__type(value, __u8);
} steer_ports SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, struct flow_key);
	__type(value, __u8);
} steer_flows SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_XSKMAP);
	__uint(max_entries, MAX_QUEUES);
	__type(key, __u32); // RX queue index
	__type(value, __u32); // AF_XDP socket fd (user space writes it)
} xsks SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, COUNTER_SLOTS);
	__type(key, __u32);
	__type(value, __u64);
} counters SEC(".maps");

static __always_inline void count(__u32 slot)
{
	__u64 *c = bpf_map_lookup_elem(&counters, &slot);

	if (c)
		*c += 1; // per-CPU slot: no atomics needed
}

static __always_inline int steer_packet(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip;
	struct tcphdr *tcp;
	__u32 ihl_len, doff_len, queue;
	__u16 dport;
	long action;

	if ((void *)(eth + 1) > data_end)
		goto pass;
	if (eth->h_proto != bpf_htons(ETH_P_IP))
		goto pass; // ARP, IPv6, VLAN (for now), ...

	ip = (void *)(eth + 1);
	if ((void *)(ip + 1) > data_end)
		goto pass;
	if (ip->version != 4 || ip->ihl < 5 || ip->protocol != IPPROTO_TCP)
		goto pass;
	// A fragment (MF set or offset non-zero) does not carry a whole TCP
	// header at a known place: leave reassembly to the kernel.
	if (ip->frag_off & bpf_htons(0x3fff))
		goto pass;

	ihl_len = (__u32)ip->ihl * 4; // 20..60
	tcp = (void *)ip + ihl_len;
	if ((void *)(tcp + 1) > data_end)
		goto pass;
	doff_len = (__u32)tcp->doff * 4; // 0..60
	if (doff_len < sizeof(*tcp))
		goto pass;
	if ((void *)tcp + doff_len > data_end)
		goto pass;

	dport = tcp->dest;
	if (!bpf_map_lookup_elem(&steer_ports, &dport)) {
		struct flow_key key = {
			.saddr = ip->saddr,
			.daddr = ip->daddr,
			.sport = tcp->source,
			.dport = tcp->dest,
		};

		if (!bpf_map_lookup_elem(&steer_flows, &key))
			goto pass;
	}

	queue = ctx->rx_queue_index;
	if (!bpf_map_lookup_elem(&xsks, &queue)) {
		count(COUNTER_NO_SOCKET);
		return XDP_PASS;
	}
	action = bpf_redirect_map(&xsks, queue, XDP_PASS);
	count(action == XDP_REDIRECT ? COUNTER_REDIRECTED : COUNTER_NO_SOCKET);
	return action;

pass:
	count(COUNTER_PASSED);
	return XDP_PASS;
}

SEC("xdp")
int steer(struct xdp_md *ctx)
{
	return steer_packet(ctx);
}

SEC("xdp.frags")
int steer_frags(struct xdp_md *ctx)
{
	return steer_packet(ctx);
}

// Uses no GPL-only helper, so the project licence string is accepted.
char _license[] SEC("license") = "MIT OR Apache-2.0";

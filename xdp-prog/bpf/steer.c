// SPDX-License-Identifier: MIT OR Apache-2.0
//
// XDP steering program for the iWARP kernel-bypass data path.
//
// Redirects IPv4 TCP packets that belong to iWARP, and the ICMP "fragmentation
// needed" messages about them, into the AF_XDP socket bound to the packet's RX
// queue; drops the first fragments of such packets; everything else goes to the
// kernel unchanged.
//
// A packet is steered when
//   * its {daddr, dport} is a key of `steer_ports` (listeners: the address and
//     port they listen on, so that the kernel keeps the port on other addresses), or
//   * its 4-tuple {saddr, daddr, sport, dport} is a key of `steer_flows`
//     (established connections).
// All keys are in network byte order, exactly as they appear on the wire.
//
// An ICMP "fragmentation needed and DF set" (type 3 code 4, RFC 792; the next-hop
// MTU of RFC 1191 section 4) is steered too when the TCP segment it quotes (IPv4
// header and first 8 octets: ports and sequence number), read in reverse, is a
// packet of ours that the rules above steer: its {saddr, sport} a key of
// `steer_ports`, or {daddr, saddr, dport, sport} of the quoted header a key of
// `steer_flows`; and the ICMP goes to that segment's source. The engine owns those
// connections and lowers their path MTU (RFC 1191, validated per RFC 5927); the
// kernel, which has no socket for them, would drop the message. Every other ICMP
// goes to the kernel.
//
// A steered packet goes to `xsks[ctx->rx_queue_index]` through
// bpf_redirect_map(..., XDP_PASS): when no AF_XDP socket is bound to that
// queue the kernel gets the packet (and will answer a SYN with a RST).
//
// Dropped (XDP_DROP): the first fragment of an IPv4 datagram carrying a TCP segment
// the rules above steer (see `fragment`).
//
// Priority tags (VLAN ID 0: IEEE 802.1Q's priority-only tag, as peers that mark their
// traffic's priority for DCB/PFC send it; 802.1Q's type 0x8100 or 802.1ad's 0x88a8, up
// to MAX_PRIORITY_TAGS stacked) are looked through, and taken off a frame that is
// steered (`pop_priority_tags`), so the engine always gets untagged frames; the kernel
// would have taken them off too (and answered a segment of an engine flow with a RST).
//
// Not steered (XDP_PASS): non-IPv4 (ARP, IPv6), frames of a VLAN (a tag with a VLAN
// ID) or with more stacked tags, other IPv4 fragments, other protocols and other ICMP,
// malformed or truncated Ethernet or IPv4 headers, TCP segments shorter than the
// fixed TCP header. A steered segment's TCP data offset and options are not checked
// here: the engine checks them (and drops a malformed segment, as the kernel would).
//
// Counters (`counters`, PERCPU_ARRAY, one u64 per CPU per slot; every packet is
// counted in exactly one slot):
//   0 = a TCP segment redirected into an AF_XDP socket,
//   1 = passed to the kernel because it is not steered,
//   2 = steered but no AF_XDP socket bound to its RX queue (passed to the kernel),
//   3 = an ICMP "fragmentation needed" redirected into an AF_XDP socket,
//   4 = the first fragment of a steered TCP segment, dropped (see `fragment`).
//
// Two entry points share the code: `steer` (SEC "xdp") and `steer_frags`
// (SEC "xdp.frags", multi-buffer aware, needed for native XDP on veth when the
// peer MTU is above 3506). Headers are only read from the first buffer: the Ethernet
// and IPv4 headers and the TCP header's fixed 20 octets must lie in it (on veth,
// mlx5 and ice the first buffer holds every header); TCP options may not (see
// `steer_packet`).

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
#define COUNTER_ICMP_REDIRECTED 3
#define COUNTER_FRAGMENT_DROPPED 4
#define COUNTER_SLOTS 5

// Must match `MAX_QUEUES` in src/lib.rs.
#define MAX_QUEUES 64

// An 802.1Q tag after the MAC addresses: the tag control information (priority,
// drop eligible, VLAN ID) and the type of what follows.
struct vlan_tag {
	__be16 tci;
	__be16 proto;
};

#define ETH_P_8021Q_TAG 0x8100
#define ETH_P_8021AD_TAG 0x88a8
#define VLAN_ID_MASK 0x0fff
// Stacked priority tags looked through (the kernel takes off any number).
#define MAX_PRIORITY_TAGS 4

// 8 octets, the padding zero; must match `listen_key` in src/lib.rs.
struct listen_key {
	__be32 addr;
	__be16 port;
	__u16 pad;
};

// 12 octets, no padding; must match `FourTuple::key` in src/lib.rs.
struct flow_key {
	__be32 saddr;
	__be32 daddr;
	__be16 sport;
	__be16 dport;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, struct listen_key); // local address and TCP port
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

// ICMP (RFC 792), as <linux/icmp.h> has it (that header pulls in libc headers the
// BPF target does not have).
#define ICMP_DEST_UNREACH 3
#define ICMP_FRAG_NEEDED 4

struct icmp_hdr {
	__u8 type;
	__u8 code;
	__sum16 checksum;
	__be16 unused;
	__be16 mtu; // next-hop MTU of "fragmentation needed" (RFC 1191 section 4)
};

// The first 8 octets of a TCP header: all an ICMP error is sure to quote (RFC 792).
struct tcp_quote {
	__be16 source;
	__be16 dest;
	__be32 seq;
};

// Takes the `tags` 4-octet priority tags out of the frame: the MAC addresses move up
// over them, and the innermost tag's `proto` becomes the frame's type. Every pointer into the packet
// is invalid afterwards. 0 when done.
static __always_inline int pop_priority_tags(struct xdp_md *ctx, int tags)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	__u8 macs[2 * ETH_ALEN];

	if (data + sizeof(macs) > data_end)
		return -1;
	__builtin_memcpy(macs, data, sizeof(macs));
	if (bpf_xdp_adjust_head(ctx, tags * (int)sizeof(struct vlan_tag)))
		return -1;
	data = (void *)(long)ctx->data;
	data_end = (void *)(long)ctx->data_end;
	if (data + sizeof(macs) > data_end)
		return -1;
	__builtin_memcpy(data, macs, sizeof(macs));
	return 0;
}

// Redirects the packet into the AF_XDP socket of its RX queue, without its `tagged`
// priority tags; `redirected` is the counter slot for success.
static __always_inline int redirect(struct xdp_md *ctx, __u32 redirected, int tagged)
{
	__u32 queue = ctx->rx_queue_index;
	long action;

	if (!bpf_map_lookup_elem(&xsks, &queue)) {
		count(COUNTER_NO_SOCKET);
		return XDP_PASS;
	}
	if (tagged && pop_priority_tags(ctx, tagged)) {
		count(COUNTER_PASSED);
		return XDP_PASS;
	}
	action = bpf_redirect_map(&xsks, queue, XDP_PASS);
	count(action == XDP_REDIRECT ? redirected : COUNTER_NO_SOCKET);
	return action;
}

// Whether {daddr, dport} is a steered listener's or the 4-tuple a steered flow's.
static __always_inline int steered(__be32 saddr, __be32 daddr, __be16 sport,
				   __be16 dport)
{
	struct listen_key listener = {
		.addr = daddr,
		.port = dport,
	};
	struct flow_key key = {
		.saddr = saddr,
		.daddr = daddr,
		.sport = sport,
		.dport = dport,
	};

	return bpf_map_lookup_elem(&steer_ports, &listener) ||
	       bpf_map_lookup_elem(&steer_flows, &key);
}

// `ip` is a whole, unfragmented IPv4 header of an ICMP packet within the first
// buffer, `icmp` right after it (IHL checked by the caller).
static __always_inline int steer_icmp(struct xdp_md *ctx, struct iphdr *ip,
				      struct icmp_hdr *icmp, void *data_end, int tagged)
{
	struct iphdr *inner;
	struct tcp_quote *th;
	__u32 inner_len;

	if ((void *)(icmp + 1) > data_end)
		goto pass;
	if (icmp->type != ICMP_DEST_UNREACH || icmp->code != ICMP_FRAG_NEEDED)
		goto pass;
	inner = (void *)(icmp + 1);
	if ((void *)(inner + 1) > data_end)
		goto pass;
	if (inner->version != 4 || inner->ihl < 5 || inner->protocol != IPPROTO_TCP)
		goto pass;
	// A later fragment quotes no TCP header; an ICMP error goes to the
	// source of the datagram it quotes (RFC 792).
	if (inner->frag_off & bpf_htons(0x1fff))
		goto pass;
	if (inner->saddr != ip->daddr)
		goto pass;
	inner_len = (__u32)inner->ihl * 4; // 20..60
	th = (void *)inner + inner_len;
	if ((void *)(th + 1) > data_end)
		goto pass;

	// The quoted segment went from us to the peer: reversed, it is one of
	// the peer's segments to us.
	if (!steered(inner->daddr, inner->saddr, th->dest, th->source))
		goto pass;
	return redirect(ctx, COUNTER_ICMP_REDIRECTED, tagged);

pass:
	count(COUNTER_PASSED);
	return XDP_PASS;
}

// An IPv4 fragment (MF set or offset non-zero; `l4` right after its header). The
// first fragment of a TCP segment of ours is dropped: the engine's TCP does not
// reassemble, and the kernel, were it to reassemble the datagram, would answer the
// segment with a RST (it has no socket for the flow) that resets the peer's
// connection. Every fragment after the first has no TCP header to match (RFC 791)
// and goes to the kernel, which, without the first, never completes the datagram
// and discards it when its reassembly time runs out. A first fragment other than
// the last carries a multiple of 8 octets (RFC 791), so its ports are there.
static __always_inline int fragment(struct iphdr *ip, struct tcp_quote *l4,
				    void *data_end)
{
	if (ip->protocol != IPPROTO_TCP || (ip->frag_off & bpf_htons(0x1fff)))
		goto pass;
	if ((void *)(l4 + 1) > data_end)
		goto pass;
	if (!steered(ip->saddr, ip->daddr, l4->source, l4->dest))
		goto pass;
	count(COUNTER_FRAGMENT_DROPPED);
	return XDP_DROP;

pass:
	count(COUNTER_PASSED);
	return XDP_PASS;
}

static __always_inline int steer_packet(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct vlan_tag *tag;
	struct iphdr *ip;
	struct tcphdr *tcp;
	__u32 ihl_len;
	__be16 proto;
	int tagged = 0;

	if ((void *)(eth + 1) > data_end)
		goto pass;
	proto = eth->h_proto;
	ip = (void *)(eth + 1);
#pragma unroll
	for (int i = 0; i < MAX_PRIORITY_TAGS; i++) {
		if (proto != bpf_htons(ETH_P_8021Q_TAG) && proto != bpf_htons(ETH_P_8021AD_TAG))
			break;
		tag = (void *)ip;
		if ((void *)(tag + 1) > data_end)
			goto pass;
		if (tag->tci & bpf_htons(VLAN_ID_MASK))
			goto pass; // a VLAN's frame: not our interface's
		proto = tag->proto;
		ip = (void *)(tag + 1);
		tagged++;
	}
	if (proto != bpf_htons(ETH_P_IP))
		goto pass; // ARP, IPv6, more stacked tags, ...

	if ((void *)(ip + 1) > data_end)
		goto pass;
	if (ip->version != 4 || ip->ihl < 5)
		goto pass;
	if (ip->protocol != IPPROTO_TCP && ip->protocol != IPPROTO_ICMP)
		goto pass;
	ihl_len = (__u32)ip->ihl * 4; // 20..60
	if (ip->frag_off & bpf_htons(0x3fff))
		return fragment(ip, (void *)ip + ihl_len, data_end);
	if (ip->protocol == IPPROTO_ICMP)
		return steer_icmp(ctx, ip, (void *)ip + ihl_len, data_end, tagged);
	tcp = (void *)ip + ihl_len;
	// The fixed TCP header only: the steering needs its ports. Its options (data offset)
	// are the engine's to check, and may run into a second buffer of a multi-buffer
	// packet on a NIC whose first buffer is short; a segment of a steered flow passed to
	// the kernel would draw its RST.
	if ((void *)(tcp + 1) > data_end)
		goto pass;

	if (!steered(ip->saddr, ip->daddr, tcp->source, tcp->dest))
		goto pass;
	return redirect(ctx, COUNTER_REDIRECTED, tagged);

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

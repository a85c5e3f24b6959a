//! Which kind of address an IP is: only `Public` ones are reached without a rule that names
//! the address.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The kind of an address, as the proxy decides on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddressClass {
    /// On the internet.
    Public,
    /// The host itself (`127.0.0.0/8`, `::1`).
    Loopback,
    /// A private network (`10/8`, `172.16/12`, `192.168/16`, `100.64/10`, `fc00::/7`).
    Private,
    /// Link-local (`169.254/16`, `fe80::/10`).
    LinkLocal,
    /// A cloud's instance metadata service (`169.254.169.254`, `fd00:ec2::254`).
    Metadata,
    /// Multicast or broadcast.
    Multicast,
    /// `0.0.0.0`, `::` and "this network".
    Unspecified,
    /// Documentation and benchmarking ranges (`192.0.2/24`, `198.51.100/24`, `203.0.113/24`,
    /// `198.18/15`, `2001:db8::/32`): never the host or its LAN by definition, yet some
    /// networks serve real hosts from them (a fake-IP resolver, a site's registry mirror, as
    /// on the machines Sandcell is tested on), so they are reached as public ones are.
    Documentation,
    /// Other reserved ranges (`240/4`, `::/8`).
    Reserved,
}

impl AddressClass {
    /// Its name in events and errors.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Public => "public",
            Self::Loopback => "loopback",
            Self::Private => "private",
            Self::LinkLocal => "link-local",
            Self::Metadata => "metadata",
            Self::Multicast => "multicast",
            Self::Unspecified => "unspecified",
            Self::Documentation => "documentation",
            Self::Reserved => "reserved",
        }
    }

    /// Reached without a rule that names the address.
    pub fn is_reachable_by_name(self) -> bool {
        matches!(self, Self::Public | Self::Documentation)
    }
}

/// The class of `ip`; an IPv4-mapped or NAT64 IPv6 address is classed by the IPv4 address
/// inside it.
pub fn classify(ip: IpAddr) -> AddressClass {
    match ip {
        IpAddr::V4(v4) => classify_v4(v4),
        IpAddr::V6(v6) => classify_v6(v6),
    }
}

fn classify_v4(ip: Ipv4Addr) -> AddressClass {
    let [a, b, c, _] = ip.octets();
    if ip == Ipv4Addr::new(169, 254, 169, 254) || ip == Ipv4Addr::new(100, 100, 100, 200) {
        return AddressClass::Metadata;
    }
    match (a, b, c) {
        (0, _, _) => AddressClass::Unspecified,
        (127, _, _) => AddressClass::Loopback,
        (10, _, _) | (192, 168, _) => AddressClass::Private,
        (172, 16..=31, _) | (100, 64..=127, _) => AddressClass::Private,
        (169, 254, _) => AddressClass::LinkLocal,
        (224..=239, _, _) => AddressClass::Multicast,
        (255, 255, 255) => AddressClass::Multicast,
        (240..=255, _, _) => AddressClass::Reserved,
        (192, 0, 0) => AddressClass::Reserved,
        (192, 0, 2) | (198, 51, 100) | (203, 0, 113) => AddressClass::Documentation,
        (198, 18..=19, _) => AddressClass::Documentation,
        _ => AddressClass::Public,
    }
}

fn classify_v6(ip: Ipv6Addr) -> AddressClass {
    if let Some(v4) = ip.to_ipv4_mapped() {
        return classify_v4(v4);
    }
    let s = ip.segments();
    // NAT64 (64:ff9b::/96) reaches the IPv4 address inside.
    if s[0] == 0x64 && s[1] == 0xff9b && s[2..6] == [0, 0, 0, 0] {
        let [a, b] = s[6].to_be_bytes();
        let [c, d] = s[7].to_be_bytes();
        return classify_v4(Ipv4Addr::new(a, b, c, d));
    }
    if ip == Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254) {
        return AddressClass::Metadata;
    }
    if ip.is_loopback() {
        return AddressClass::Loopback;
    }
    if ip.is_unspecified() {
        return AddressClass::Unspecified;
    }
    match s[0] {
        0xfc00..=0xfdff => AddressClass::Private,
        0xfe80..=0xfebf => AddressClass::LinkLocal,
        0xff00..=0xffff => AddressClass::Multicast,
        // Documentation.
        0x2001 if s[1] == 0x0db8 => AddressClass::Documentation,
        // The deprecated IPv4-compatible form and the rest of ::/8.
        0x0000..=0x00ff => AddressClass::Reserved,
        _ => AddressClass::Public,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn class(s: &str) -> AddressClass {
        classify(s.parse().unwrap_or_else(|e| panic!("{s}: {e}")))
    }

    #[test]
    fn every_kind_of_address_is_classed() {
        for (ip, want) in [
            ("8.8.8.8", AddressClass::Public),
            ("2606:4700::1111", AddressClass::Public),
            ("127.0.0.1", AddressClass::Loopback),
            ("127.1.2.3", AddressClass::Loopback),
            ("::1", AddressClass::Loopback),
            ("10.1.2.3", AddressClass::Private),
            ("172.16.0.1", AddressClass::Private),
            ("172.31.255.255", AddressClass::Private),
            ("172.32.0.1", AddressClass::Public),
            ("192.168.1.1", AddressClass::Private),
            ("100.64.0.1", AddressClass::Private),
            ("fd12::1", AddressClass::Private),
            ("169.254.1.1", AddressClass::LinkLocal),
            ("fe80::1", AddressClass::LinkLocal),
            ("169.254.169.254", AddressClass::Metadata),
            ("fd00:ec2::254", AddressClass::Metadata),
            ("224.0.0.1", AddressClass::Multicast),
            ("255.255.255.255", AddressClass::Multicast),
            ("ff02::1", AddressClass::Multicast),
            ("0.0.0.0", AddressClass::Unspecified),
            ("::", AddressClass::Unspecified),
            ("192.0.2.1", AddressClass::Documentation),
            ("203.0.113.80", AddressClass::Documentation),
            ("198.18.0.7", AddressClass::Documentation),
            ("2001:db8::1", AddressClass::Documentation),
            ("192.0.0.8", AddressClass::Reserved),
            ("240.0.0.1", AddressClass::Reserved),
        ] {
            assert_eq!(class(ip), want, "{ip}");
        }
    }

    #[test]
    fn an_ipv4_address_inside_an_ipv6_one_is_classed_as_itself() {
        assert_eq!(class("::ffff:127.0.0.1"), AddressClass::Loopback);
        assert_eq!(class("::ffff:169.254.169.254"), AddressClass::Metadata);
        assert_eq!(class("64:ff9b::a9fe:a9fe"), AddressClass::Metadata);
        assert_eq!(class("64:ff9b::808:808"), AddressClass::Public);
        assert_eq!(class("::127.0.0.1"), AddressClass::Reserved);
    }
}

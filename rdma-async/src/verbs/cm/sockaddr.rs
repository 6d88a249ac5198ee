//! Conversions between `SocketAddr` and the C socket addresses rdma_cm takes and reports.

use std::io;
use std::mem;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

/// A C socket address for `addr`, with its length.
pub(super) fn to_sockaddr(addr: SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: sockaddr_storage is plain old data; all-zero is a valid (AF_UNSPEC) value.
    let mut storage: libc::sockaddr_storage = unsafe { mem::zeroed() };
    let len = match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than and suitably aligned for sockaddr_in.
            unsafe { std::ptr::write(std::ptr::from_mut(&mut storage).cast(), sin) };
            mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: sockaddr_storage is larger than and suitably aligned for sockaddr_in6.
            unsafe { std::ptr::write(std::ptr::from_mut(&mut storage).cast(), sin6) };
            mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (storage, len as libc::socklen_t)
}

/// Reads a C socket address.
///
/// # Safety
///
/// `sa` must be null or point at a readable socket address whose family field tells its size
/// (as the address fields of a live `rdma_cm_id` do).
pub(super) unsafe fn from_sockaddr(sa: *const libc::sockaddr) -> io::Result<SocketAddr> {
    let unsupported = || {
        io::Error::new(
            io::ErrorKind::Unsupported,
            "address family is not IPv4 or IPv6",
        )
    };
    if sa.is_null() {
        return Err(unsupported());
    }
    // SAFETY: the caller guarantees `sa` is readable as at least a sockaddr header.
    let family = i32::from(unsafe { (*sa).sa_family });
    match family {
        libc::AF_INET => {
            // SAFETY: the family says this is a sockaddr_in; read unaligned to be safe.
            let sin = unsafe { sa.cast::<libc::sockaddr_in>().read_unaligned() };
            let ip = Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes());
            Ok(SocketAddr::V4(SocketAddrV4::new(
                ip,
                u16::from_be(sin.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says this is a sockaddr_in6; read unaligned to be safe.
            let sin6 = unsafe { sa.cast::<libc::sockaddr_in6>().read_unaligned() };
            let ip = Ipv6Addr::from(sin6.sin6_addr.s6_addr);
            Ok(SocketAddr::V6(SocketAddrV6::new(
                ip,
                u16::from_be(sin6.sin6_port),
                sin6.sin6_flowinfo,
                sin6.sin6_scope_id,
            )))
        }
        _ => Err(unsupported()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_v4_and_v6() {
        for addr in ["10.77.0.1:7471", "[fd77::1]:65535", "0.0.0.0:0"] {
            let addr: SocketAddr = addr.parse().unwrap();
            let (storage, _) = to_sockaddr(addr);
            // SAFETY: `storage` holds the address just written.
            let back = unsafe { from_sockaddr(std::ptr::from_ref(&storage).cast()) }.unwrap();
            assert_eq!(back, addr);
        }
    }

    #[test]
    fn rejects_other_families() {
        // SAFETY: all-zero storage is AF_UNSPEC.
        let storage: libc::sockaddr_storage = unsafe { mem::zeroed() };
        // SAFETY: `storage` is a readable socket address.
        let err = unsafe { from_sockaddr(std::ptr::from_ref(&storage).cast()) }.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::Unsupported);
    }
}

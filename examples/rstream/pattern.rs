//! The `-T v` data pattern: every byte sent is the next value of a wrapping 8-bit counter, and
//! every byte received must be the next value of a second one.
//!
//! As in librdmacm's `format_buf`/`verify_buf`, the counters start at 0 when the process starts
//! and never reset: they include the 16 sync bytes of every test and carry on from one
//! connection to the next (the default run opens two). Both tools count the same way, so a C
//! peer's stream verifies here and ours verifies there.

use std::io;

#[derive(Debug, Default)]
pub struct Pattern {
    next_send: u8,
    next_recv: u8,
    /// Bytes verified so far, to say where a mismatch is.
    verified: u64,
}

impl Pattern {
    /// Fills `buf` with the next bytes of the sending counter.
    pub fn fill(&mut self, buf: &mut [u8]) {
        for byte in buf {
            *byte = self.next_send;
            self.next_send = self.next_send.wrapping_add(1);
        }
    }

    /// Checks `buf` against the receiving counter; a mismatch names the byte's position in
    /// everything this process has verified, counted from 0.
    pub fn check(&mut self, buf: &[u8]) -> io::Result<()> {
        for &byte in buf {
            if byte != self.next_recv {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "data verification failed byte {} (expected {:#04x}, got {byte:#04x})",
                        self.verified, self.next_recv
                    ),
                ));
            }
            self.next_recv = self.next_recv.wrapping_add(1);
            self.verified += 1;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_continue_and_wrap() {
        let mut tx = Pattern::default();
        let mut rx = Pattern::default();
        let mut buf = [0u8; 200];
        tx.fill(&mut buf[..16]);
        rx.check(&buf[..16]).unwrap();
        tx.fill(&mut buf);
        assert_eq!(buf[0], 16);
        assert_eq!(buf[160], 176);
        assert_eq!(buf[199], 215);
        rx.check(&buf).unwrap();
        tx.fill(&mut buf);
        assert_eq!((buf[39], buf[40]), (255, 0), "byte 256 wraps to 0");
        rx.check(&buf).unwrap();
    }

    #[test]
    fn mismatch_names_the_byte() {
        let mut rx = Pattern::default();
        rx.check(&[0, 1, 2]).unwrap();
        let err = rx.check(&[3, 4, 9]).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        assert!(
            err.to_string()
                .starts_with("data verification failed byte 5"),
            "{err}"
        );
    }
}

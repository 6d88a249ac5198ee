//! Memory the crate maps for registration: anonymous huge pages and files.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::ptr::NonNull;

use crate::error;

/// An `mmap` this process owns; unmapped on drop.
#[derive(Debug)]
pub(crate) struct Mapping {
    ptr: NonNull<u8>,
    /// The length passed to `mmap` (rounded up to the page size in use).
    mapped: usize,
}

// SAFETY: a mapping is plain memory; `RegisteredBuffer` synchronises the copies in and out.
unsafe impl Send for Mapping {}
// SAFETY: `&self` methods only read immutable fields.
unsafe impl Sync for Mapping {}

/// Where the huge page size is written, and what is assumed when it cannot be read.
const MEMINFO: &str = "/proc/meminfo";
const DEFAULT_HUGE_PAGE: usize = 2 << 20;

/// The default huge page size of this kernel (`Hugepagesize` in `/proc/meminfo`).
pub(crate) fn huge_page_size() -> usize {
    std::fs::read_to_string(MEMINFO)
        .ok()
        .and_then(|info| {
            info.lines()
                .find_map(|line| line.strip_prefix("Hugepagesize:"))
                .and_then(|rest| {
                    rest.trim()
                        .trim_end_matches("kB")
                        .trim()
                        .parse::<usize>()
                        .ok()
                })
        })
        .map_or(DEFAULT_HUGE_PAGE, |kib| kib * 1024)
}

impl Mapping {
    /// `len` bytes (rounded up to whole huge pages) of zeroed anonymous memory backed by huge
    /// pages (`MAP_HUGETLB`).
    pub(crate) fn huge(len: usize) -> io::Result<Self> {
        let page = huge_page_size();
        let mapped = len
            .checked_next_multiple_of(page)
            .ok_or_else(|| error::invalid_input("huge page mapping size overflows"))?;
        let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_HUGETLB;
        // SAFETY: an anonymous mapping at an address the kernel picks touches no existing memory.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                mapped,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            let err = io::Error::last_os_error();
            let free = std::fs::read_to_string(MEMINFO)
                .ok()
                .and_then(|info| {
                    info.lines()
                        .find(|line| line.starts_with("HugePages_Free:"))
                        .map(|line| line.split_whitespace().last().unwrap_or("?").to_owned())
                })
                .unwrap_or_else(|| "an unknown number of".to_owned());
            return Err(io::Error::new(
                err.kind(),
                format!(
                    "cannot map {mapped} bytes of {} KiB huge pages ({err}); {free} huge pages \
                     are free: reserve more with `echo N > /proc/sys/vm/nr_hugepages`",
                    page / 1024
                ),
            ));
        }
        Ok(Mapping {
            // mmap never returns null on success.
            ptr: NonNull::new(ptr.cast()).ok_or_else(|| error::invalid_input("mmap gave null"))?,
            mapped,
        })
    }

    /// `len` bytes of `file` from `offset`, read-only: shared (the page cache itself) or private
    /// (the page cache until something writes the pages, which then become private copies).
    ///
    /// The range must lie inside the file: touching a page past its end would raise `SIGBUS`.
    pub(crate) fn file_read_only(
        file: &File,
        offset: u64,
        len: usize,
        shared: bool,
    ) -> io::Result<Self> {
        let size = file.metadata()?.len();
        let end = offset.checked_add(len as u64);
        if len == 0 || end.is_none_or(|end| end > size) {
            return Err(error::invalid_input(format!(
                "range {offset}+{len} is not inside the {size}-byte file"
            )));
        }
        let page = page_size();
        if !offset.is_multiple_of(page as u64) {
            return Err(error::invalid_input(format!(
                "a file mapping must start at a multiple of the page size ({page}), not {offset}"
            )));
        }
        let offset = libc::off_t::try_from(offset)
            .map_err(|_| error::invalid_input("file offset too large"))?;
        // SAFETY: a new read-only shared mapping of an open file at an address the kernel picks;
        // the range was checked to lie inside the file.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                if shared {
                    libc::MAP_SHARED
                } else {
                    libc::MAP_PRIVATE
                },
                file.as_raw_fd(),
                offset,
            )
        };
        if ptr == libc::MAP_FAILED {
            let err = io::Error::last_os_error();
            let hint = if err.raw_os_error() == Some(libc::EINVAL) {
                " (its file system may not support shared mappings: 9p without a cache, some \
                 FUSE file systems)"
            } else {
                ""
            };
            return Err(io::Error::new(
                err.kind(),
                format!("cannot map {len} bytes of the file: {err}{hint}"),
            ));
        }
        Ok(Mapping {
            ptr: NonNull::new(ptr.cast()).ok_or_else(|| error::invalid_input("mmap gave null"))?,
            mapped: len,
        })
    }

    pub(crate) fn ptr(&self) -> NonNull<u8> {
        self.ptr
    }
}

/// The base page size.
pub(crate) fn page_size() -> usize {
    // SAFETY: sysconf has no memory-safety preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(size).unwrap_or(4096)
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the mapping made in a constructor, unmapped once; its owner deregistered it
        // first, and no reference into it exists.
        if unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.mapped) } != 0 {
            tracing::warn!(
                len = self.mapped,
                "munmap failed: {}",
                io::Error::last_os_error()
            );
        }
    }
}

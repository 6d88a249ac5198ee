//! [`BufferPool`]: registered buffers in size classes, carved out of large slab registrations and
//! returned to the pool when dropped.

use std::io;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

use tokio::sync::Notify;

use super::DeviceContext;
use crate::error;
use crate::memory::LocalRegion;
use crate::verbs::{Access, RegisteredBuffer, SlabSlice, SliceHome, UserBuffer};

/// The sizes and bounds of a [`BufferPool`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolOptions {
    classes: Vec<usize>,
    slab_bytes: usize,
    max_bytes: usize,
}

impl Default for PoolOptions {
    /// Classes of 4 KiB, 64 KiB and 1 MiB; 4 MiB slabs; at most 256 MiB registered.
    fn default() -> Self {
        PoolOptions {
            classes: vec![4 << 10, 64 << 10, 1 << 20],
            slab_bytes: 4 << 20,
            max_bytes: 256 << 20,
        }
    }
}

impl PoolOptions {
    /// The defaults: see [`PoolOptions::default`].
    pub fn new() -> Self {
        PoolOptions::default()
    }

    /// The buffer sizes; a request takes the smallest class that fits it.
    pub fn size_classes(mut self, sizes: impl IntoIterator<Item = usize>) -> Self {
        self.classes = sizes.into_iter().collect();
        self.classes.sort_unstable();
        self.classes.dedup();
        self
    }

    /// The bytes registered at once (one `ibv_reg_mr`) when a class runs out: a slab holds
    /// `slab_bytes / size` buffers of a class, and at least one.
    pub fn slab_bytes(mut self, bytes: usize) -> Self {
        self.slab_bytes = bytes;
        self
    }

    /// The most bytes the pool registers in all; once reached, [`BufferPool::try_get`] fails
    /// and [`BufferPool::get`] waits for a buffer to come back.
    pub fn max_bytes(mut self, bytes: usize) -> Self {
        self.max_bytes = bytes;
        self
    }

    fn check(&self) -> io::Result<()> {
        let invalid = |what: String| Err(error::invalid_input(what));
        match (self.classes.first(), self.classes.last()) {
            (None, _) | (_, None) => invalid("a buffer pool needs at least one size class".into()),
            (Some(0), _) => invalid("a size class of 0 bytes".into()),
            (_, Some(&largest)) if largest > u32::MAX as usize => invalid(format!(
                "a size class of {largest} bytes (at most {} fit a work request)",
                u32::MAX
            )),
            (_, Some(&largest)) if largest > self.max_bytes => invalid(format!(
                "the largest size class ({largest} bytes) exceeds the pool's bound of {} bytes",
                self.max_bytes
            )),
            _ => Ok(()),
        }
    }
}

/// How a [`BufferPool`] is used, for monitoring and leak checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PoolStats {
    /// Slab registrations made (`ibv_reg_mr` calls).
    pub slabs: usize,
    /// Bytes registered in all slabs.
    pub registered_bytes: usize,
    /// Buffers handed out and not yet returned.
    pub in_use: usize,
    /// Buffers handed out since the pool was made.
    pub handed_out: u64,
    /// Buffers returned since the pool was made.
    pub returned: u64,
    /// Requests refused because the pool was at its bound ([`BufferPool::try_get`] errors).
    pub exhausted: u64,
}

/// Registered buffers in size classes, for sends, receives and RDMA operations that would
/// otherwise register memory per message.
///
/// Memory is registered in slabs (one `ibv_reg_mr` each, made when a class first runs out), and
/// handed out as [`LocalRegion`]s, so a pool buffer goes wherever a region does (every
/// `RdmaConnection` and `SharedReceiveQueue` operation, `RStream::write_region`). Dropping the
/// region returns the buffer; a buffer an operation still owns comes back when the operation
/// does. The pool is bounded ([`PoolOptions::max_bytes`]); registered slabs stay until the pool
/// and all its buffers are dropped.
///
/// A buffer's length is its class size, at least what was asked; its contents are whatever its
/// last user left (zeroes when new). Cloning gives another handle to the same pool.
#[derive(Debug, Clone)]
pub struct BufferPool {
    inner: Arc<PoolInner>,
}

#[derive(Debug)]
struct PoolInner {
    context: DeviceContext,
    options: PoolOptions,
    state: Mutex<PoolState>,
    returned: Notify,
}

#[derive(Debug, Default)]
struct PoolState {
    /// Per class: the free buffers, as (slab, offset).
    free: Vec<Vec<(usize, usize)>>,
    slabs: Vec<Slab>,
    stats: PoolStats,
}

#[derive(Debug)]
struct Slab {
    buffer: Arc<RegisteredBuffer>,
    home: Arc<SlabHome>,
}

/// Where the buffers of one slab return.
#[derive(Debug)]
struct SlabHome {
    pool: Weak<PoolInner>,
    class: usize,
    slab: usize,
}

impl SliceHome for SlabHome {
    fn give_back(&self, offset: usize) {
        // A pool dropped before its buffers: the slab goes when its last buffer does.
        let Some(pool) = self.pool.upgrade() else {
            return;
        };
        {
            let mut state = pool.lock();
            state.free[self.class].push((self.slab, offset));
            state.stats.in_use -= 1;
            state.stats.returned += 1;
        }
        pool.returned.notify_waiters();
    }
}

impl PoolInner {
    fn lock(&self) -> MutexGuard<'_, PoolState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl DeviceContext {
    /// A new, empty pool of registered buffers in this context.
    ///
    /// # Errors
    ///
    /// `InvalidInput` when the options have no size class, a class of 0 or more than
    /// `u32::MAX` bytes, or a class larger than the bound.
    pub fn buffer_pool(&self, options: &PoolOptions) -> io::Result<BufferPool> {
        options.check()?;
        let state = PoolState {
            free: vec![Vec::new(); options.classes.len()],
            ..PoolState::default()
        };
        Ok(BufferPool {
            inner: Arc::new(PoolInner {
                context: self.clone(),
                options: options.clone(),
                state: Mutex::new(state),
                returned: Notify::new(),
            }),
        })
    }
}

impl BufferPool {
    /// A buffer of at least `len` bytes, now.
    ///
    /// # Errors
    ///
    /// `InvalidInput` when `len` is 0 or larger than the largest class; `WouldBlock` when no
    /// buffer of the class is free and registering another slab would pass the bound; the OS
    /// error of `ibv_reg_mr` for a new slab.
    pub fn try_get(&self, len: usize) -> io::Result<LocalRegion> {
        let class = self.class_for(len)?;
        let inner = &self.inner;
        let mut state = inner.lock();
        if state.free[class].is_empty() {
            self.grow(&mut state, class)?;
        }
        let (slab, offset) = state.free[class]
            .pop()
            .ok_or_else(|| error::invalid_input("a new slab has no buffers"))?;
        let size = inner.options.classes[class];
        let home: Arc<dyn SliceHome> = state.slabs[slab].home.clone();
        let slice = SlabSlice::new(state.slabs[slab].buffer.clone(), offset, size, home);
        match slice {
            Ok(slice) => {
                state.stats.in_use += 1;
                state.stats.handed_out += 1;
                drop(state);
                Ok(LocalRegion::new(UserBuffer::slice(slice)))
            }
            Err(e) => {
                // Never happens: slabs are carved in whole buffers. Keep the buffer free.
                state.free[class].push((slab, offset));
                Err(e)
            }
        }
    }

    /// A buffer of at least `len` bytes, waiting for one to be returned when the pool is at its
    /// bound.
    ///
    /// # Errors
    ///
    /// As [`Self::try_get`], except that exhaustion waits instead.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: a dropped call takes no buffer.
    pub async fn get(&self, len: usize) -> io::Result<LocalRegion> {
        loop {
            let returned = self.inner.returned.notified();
            tokio::pin!(returned);
            // Registered before trying, so a return between the try and the wait is not missed.
            returned.as_mut().enable();
            match self.try_get(len) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => returned.await,
                other => return other,
            }
        }
    }

    /// The counts so far.
    pub fn stats(&self) -> PoolStats {
        self.inner.lock().stats
    }

    /// The class sizes.
    pub fn size_classes(&self) -> &[usize] {
        &self.inner.options.classes
    }

    /// The context the buffers are registered in.
    pub fn context(&self) -> &DeviceContext {
        &self.inner.context
    }

    fn class_for(&self, len: usize) -> io::Result<usize> {
        let classes = &self.inner.options.classes;
        match classes.iter().position(|&size| size >= len) {
            Some(class) if len > 0 => Ok(class),
            _ => Err(error::invalid_input(format!(
                "a pool buffer must have 1 to {} bytes (the largest size class), not {len}",
                classes.last().copied().unwrap_or(0)
            ))),
        }
    }

    /// Registers one more slab for `class`, within the bound.
    fn grow(&self, state: &mut PoolState, class: usize) -> io::Result<()> {
        let options = &self.inner.options;
        let size = options.classes[class];
        let count = (options.slab_bytes / size).max(1);
        let room = options.max_bytes - state.stats.registered_bytes;
        // A smaller slab when the bound leaves room for some buffers but not a full slab.
        let count = count.min(room / size);
        if count == 0 {
            state.stats.exhausted += 1;
            return Err(io::Error::new(
                io::ErrorKind::WouldBlock,
                format!(
                    "the buffer pool is exhausted: all {size}-byte buffers are in use and {} of \
                     its {} bytes are registered; buffers come back when dropped",
                    state.stats.registered_bytes, options.max_bytes
                ),
            ));
        }
        let bytes = size * count;
        let buffer =
            RegisteredBuffer::new(self.inner.context.pd().clone(), bytes, Access::default())?;
        let slab = state.slabs.len();
        state.slabs.push(Slab {
            buffer: Arc::new(buffer),
            home: Arc::new(SlabHome {
                pool: Arc::downgrade(&self.inner),
                class,
                slab,
            }),
        });
        // Handed out from the start of the slab first (popped from the end).
        state.free[class].extend((0..count).rev().map(|i| (slab, i * size)));
        state.stats.slabs += 1;
        state.stats.registered_bytes += bytes;
        Ok(())
    }
}

//! Memory, registered on a protection domain: registrations (`ibv_mr`) of memory of every
//! origin and of parts of it, the caller-owned buffers made of them, memory windows over them
//! (`ibv_mw`) and on-demand paging.

mod access;
mod foreign_memory;
mod mapping;
mod memory;
mod memory_window;
mod odp;
mod range_registration;
mod registration;
mod user_buffer;

pub(crate) use access::{Access, RegFlags};
// `pub` so that the test hooks (`--cfg rdma_async_hooks`) can re-export it; without them it stays
// crate-private.
pub use foreign_memory::ForeignMemory;
pub(crate) use mapping::{huge_page_size, page_size};
pub(crate) use memory::RegisteredBuffer;
pub(super) use memory_window::fill_invalidate_key;
pub(crate) use memory_window::{MemoryWindow, WindowBinding, WindowOp};
pub(crate) use odp::{OdpCaps, prefetch};
pub(crate) use user_buffer::{SlabSlice, SliceHome, UserBuffer};

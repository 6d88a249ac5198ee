//! Completions, above rdma_cm (a completion channel is opened on the device context of an id,
//! which it keeps, or, shared by many connections, on one of librdmacm's device list, which it
//! keeps instead): completion channels and queues (`ibv_comp_channel`, `ibv_cq`), the routing of
//! a shared channel's events to their queues (`CqEventSink`), and the work completions (`ibv_wc`)
//! polled from them.

mod completion_batch;
mod completion_queue;
mod polled_completion;
mod wc_error;
mod work_completion;

pub(crate) use completion_batch::CompletionBatch;
pub(crate) use completion_queue::{CompletionChannel, CompletionQueue, CqEventSink};
pub(crate) use polled_completion::PolledCompletion;
pub(crate) use wc_error::{completion_error, wc_error};
pub(crate) use work_completion::{WcStatus, WorkCompletion};

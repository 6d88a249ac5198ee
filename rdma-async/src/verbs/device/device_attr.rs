//! `ibv_query_device` and `ibv_query_port`: what a device and its ports can do.

use std::ffi::CStr;
use std::io;
use std::ptr::NonNull;

use rdma_async_sys as sys;

use crate::error;

/// Queries a device context (`ibv_query_device`).
pub(crate) fn query_device(ctx: NonNull<sys::ibv_context>) -> io::Result<sys::ibv_device_attr> {
    // SAFETY: ibv_device_attr is plain old data; zero is valid for every field.
    let mut attr: sys::ibv_device_attr = unsafe { std::mem::zeroed() };
    // SAFETY: `ctx` is a live context and `attr` a valid out-pointer.
    let ret = unsafe { sys::ibv_query_device(ctx.as_ptr(), &mut attr) };
    if ret != 0 {
        return Err(error::call_error("ibv_query_device", ret));
    }
    Ok(attr)
}

/// Queries one port of a device context (`ibv_query_port`).
pub(crate) fn query_port(
    ctx: NonNull<sys::ibv_context>,
    port: u8,
) -> io::Result<sys::ibv_port_attr> {
    // SAFETY: ibv_port_attr is plain old data; zero is valid for every field.
    let mut attr: sys::ibv_port_attr = unsafe { std::mem::zeroed() };
    // SAFETY: `ctx` is a live context and `attr` a valid out-pointer.
    let ret = unsafe { sys::rdma_async_query_port(ctx.as_ptr(), port, &mut attr) };
    if ret != 0 {
        return Err(error::call_error("ibv_query_port", ret));
    }
    Ok(attr)
}

/// The name of a context's device (`ibv_get_device_name`).
pub(crate) fn device_name(ctx: NonNull<sys::ibv_context>) -> String {
    // SAFETY: a live context points at its live device.
    let dev = unsafe { (*ctx.as_ptr()).device };
    // SAFETY: ibv_get_device_name returns NULL or a NUL-terminated string inside the device.
    let name = unsafe { sys::ibv_get_device_name(dev) };
    if name.is_null() {
        return String::new();
    }
    // SAFETY: checked non-NULL above; the string lives as long as the device.
    unsafe { CStr::from_ptr(name) }
        .to_string_lossy()
        .into_owned()
}

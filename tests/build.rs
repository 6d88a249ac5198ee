//! Generates the greeter's gRPC code (the `greeter` module, for the tonic tests) from the examples' proto, with a vendored protoc.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut config = tonic_prost_build::Config::new();
    config.protoc_executable(protoc_bin_vendored::protoc_bin_path()?);
    tonic_prost_build::configure().compile_with_config(
        config,
        &["../examples/proto/greeter.proto"],
        &["../examples/proto"],
    )?;
    Ok(())
}

//! Compiles `proto/admin.proto` with protox (pure Rust; no protoc binary) into the tonic
//! client and server of the admin service.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "../proto/admin.proto";
    println!("cargo:rerun-if-changed={proto}");
    let fds = protox::compile([proto], ["../proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}

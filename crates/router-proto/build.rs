//! Generates the gRPC code with a vendored protoc: no system protoc needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    let proto_dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../proto");
    let file = proto_dir.join("router.proto");
    println!("cargo:rerun-if-changed={}", file.display());
    // prost-build finds protoc through this variable.
    std::env::set_var("PROTOC", protoc);
    tonic_prost_build::configure().compile_protos(&[file], &[proto_dir])?;
    Ok(())
}

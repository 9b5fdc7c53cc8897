fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../proto");
    let mgmt = dir.join("mgmt.proto");
    let data = dir.join("data.proto");
    tonic_build::configure().compile_protos(&[&mgmt, &data], &[&dir])?;
    println!("cargo:rerun-if-changed={}", mgmt.display());
    println!("cargo:rerun-if-changed={}", data.display());
    Ok(())
}

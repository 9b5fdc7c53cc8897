fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../proto");
    let mgmt = dir.join("mgmt.proto");
    let data = dir.join("data.proto");
    let ms = dir.join("ms_state.proto");
    // The services' client and server modules need tonic: only with the
    // `grpc` feature (the messages alone serve the storage core).
    let grpc = r#"#[cfg(feature = "grpc")]"#;
    tonic_build::configure()
        .client_mod_attribute(".", grpc)
        .server_mod_attribute(".", grpc)
        .compile_protos(&[&mgmt, &data], &[&dir])?;
    // The management service's state (messages only, no service): the mgmt
    // enums it holds are those of `crate::mgmt`, and its maps keep their
    // order (stable bytes). In a directory of its own, beside the above.
    let ms_out = std::path::PathBuf::from(std::env::var("OUT_DIR")?).join("ms");
    std::fs::create_dir_all(&ms_out)?;
    tonic_build::Config::new()
        .out_dir(&ms_out)
        .extern_path(".peregrine.mgmt.v1", "crate::mgmt")
        .btree_map([".peregrine.ms.v1"])
        .compile_protos(&[&ms], &[&dir])?;
    println!("cargo:rerun-if-changed={}", mgmt.display());
    println!("cargo:rerun-if-changed={}", data.display());
    println!("cargo:rerun-if-changed={}", ms.display());
    Ok(())
}

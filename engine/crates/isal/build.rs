fn main() {
    // Debian's libisal-dev installs libisal.so into the default search path.
    println!("cargo:rustc-link-lib=dylib=isal");
}

fn main() {
    // Pods get the library from a host directory mounted into images that
    // need not have ISA-L: it finds its libisal.so.2 next to itself.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-rpath,$ORIGIN");
}

//! The `whale` command; everything it does lives in the `whale` library.

fn main() -> std::process::ExitCode {
    whale_kernels::runtime::configure_cpu();
    whale::cli::main()
}

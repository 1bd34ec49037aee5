//! Builds the XDP program `bpf/steer.c` into `$OUT_DIR/steer.o` with
//! `clang -O2 -g -target bpfel` (`bpfeb` for a big-endian target); `src/lib.rs` embeds the object.
//!
//! Needs the Debian packages `clang` and `libbpf-dev` (which pulls in `linux-libc-dev`);
//! `scripts/install-deps.sh` installs them. `$CLANG` overrides the compiler.

use std::{
    env,
    path::{Path, PathBuf},
    process::Command,
};

const SOURCE: &str = "bpf/steer.c";

/// Stops the build with `msg` (cargo shows a build script's stderr when it fails).
fn fail(msg: &str) -> ! {
    eprintln!("\nerror: xdp-prog: {msg}\n");
    std::process::exit(1);
}

/// Include directories that hold `bpf/bpf_helpers.h` on Debian (and source installs).
fn find_header(rel: &str, dirs: &[PathBuf]) -> Option<PathBuf> {
    dirs.iter().map(|d| d.join(rel)).find(|p| p.exists())
}

/// Debian's multiarch include directory (`asm/types.h` lives there; the BPF targets do not
/// search it by themselves).
fn multiarch_include() -> Option<PathBuf> {
    let arch = env::var("CARGO_CFG_TARGET_ARCH").ok()?;
    let triple = match arch.as_str() {
        "powerpc64" if big_endian_target() => "powerpc64-linux-gnu",
        "x86_64" => "x86_64-linux-gnu",
        "aarch64" => "aarch64-linux-gnu",
        "arm" => "arm-linux-gnueabihf",
        "riscv64" => "riscv64-linux-gnu",
        "powerpc64" => "powerpc64le-linux-gnu",
        "s390x" => "s390x-linux-gnu",
        "x86" => "i386-linux-gnu",
        _ => return None,
    };
    let dir = Path::new("/usr/include").join(triple);
    dir.exists().then_some(dir)
}

/// Whether the crate is built for a big-endian target (the BPF object must be in the byte
/// order of the kernel that loads it, not of the machine that builds it).
fn big_endian_target() -> bool {
    env::var("CARGO_CFG_TARGET_ENDIAN").is_ok_and(|e| e == "big")
}

fn main() {
    println!("cargo:rerun-if-changed={SOURCE}");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=CLANG");

    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let out = PathBuf::from(env::var("OUT_DIR").expect("OUT_DIR")).join("steer.o");
    let clang = env::var("CLANG").unwrap_or_else(|_| "clang".to_string());

    match Command::new(&clang).arg("--version").output() {
        Ok(o) if o.status.success() => {}
        _ => fail(&format!(
            "`{clang}` not found: the XDP program is C built with clang. \
             Install the Debian package `clang` (run scripts/install-deps.sh as root), \
             or point $CLANG at a clang with the BPF target."
        )),
    }

    let mut includes = vec![
        PathBuf::from("/usr/include"),
        PathBuf::from("/usr/local/include"),
    ];
    let multiarch = multiarch_include();
    includes.extend(multiarch.clone());
    if find_header("bpf/bpf_helpers.h", &includes).is_none() {
        fail(
            "bpf/bpf_helpers.h not found: install the Debian package `libbpf-dev` \
             (run scripts/install-deps.sh as root).",
        );
    }
    if find_header("linux/bpf.h", &includes).is_none() {
        fail(
            "linux/bpf.h not found: install the Debian package `linux-libc-dev` \
             (a dependency of `libbpf-dev`; run scripts/install-deps.sh as root).",
        );
    }

    let mut cmd = Command::new(&clang);
    // `bpf` alone is the build machine's byte order: name the target's.
    let bpf_target = if big_endian_target() {
        "bpfeb"
    } else {
        "bpfel"
    };
    cmd.args(["-O2", "-g", "-target", bpf_target, "-Wall"]);
    if let Some(dir) = &multiarch {
        cmd.arg("-I").arg(dir);
    }
    cmd.arg("-c").arg(manifest.join(SOURCE)).arg("-o").arg(&out);
    let output = cmd
        .output()
        .unwrap_or_else(|e| fail(&format!("running `{clang}` failed: {e}")));
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let hint = if stderr.contains("bpf_helpers.h") {
            "\nhint: install the Debian package `libbpf-dev`"
        } else if stderr.contains("asm/") || stderr.contains("linux/") {
            "\nhint: install the Debian package `linux-libc-dev`"
        } else {
            ""
        };
        fail(&format!(
            "clang failed to build {SOURCE} ({}):\n{stderr}{hint}",
            output.status
        ));
    }
}

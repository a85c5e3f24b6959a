//! The file API through the engine.

use sandcell_protocol::{ErrorCode, FileKind};

use super::common::*;

#[tokio::test]
async fn write_read_list_stat_rename_remove() {
    let sb = sandbox().await;
    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    let entry = sb
        .write_file("data/blob.bin", &data, Some(0o600))
        .await
        .unwrap();
    assert_eq!(
        (entry.size, entry.mode, entry.kind),
        (data.len() as u64, 0o600, FileKind::File)
    );
    assert_eq!(entry.path, "/workspace/data/blob.bin");
    assert_eq!(
        sb.read_file("/workspace/data/blob.bin").await.unwrap(),
        data
    );
    // Visible to processes, owned by the sandbox user.
    let out = sh(&sb, "stat -c '%u %s' /workspace/data/blob.bin").await;
    assert_eq!(text(&out.stdout), "65532 3000000\n");
    sb.append_file("data/log.txt", b"a").await.unwrap();
    sb.append_file("data/log.txt", b"b").await.unwrap();
    assert_eq!(sb.read_file("data/log.txt").await.unwrap(), b"ab");
    sb.make_dir("/tmp/x/y/z").await.unwrap();
    let listing = sb.list_dir("data").await.unwrap();
    let names: Vec<_> = listing
        .iter()
        .map(|e| (e.name.as_str(), e.is_dir))
        .collect();
    assert_eq!(names, [("blob.bin", false), ("log.txt", false)]);
    assert!(listing[0].mtime > 1_600_000_000);
    let moved = sb
        .rename("data/log.txt", "/home/sandbox/log.txt")
        .await
        .unwrap();
    assert_eq!(moved.path, "/home/sandbox/log.txt");
    assert_eq!(
        sb.stat("data/log.txt").await.unwrap_err().code(),
        ErrorCode::NotFound
    );
    assert_eq!(
        sb.remove("data", false).await.unwrap_err().code(),
        ErrorCode::DirectoryNotEmpty
    );
    sb.remove("data", true).await.unwrap();
    assert!(sb.list_dir("/workspace").await.unwrap().is_empty());
    sb.destroy().await.unwrap();
}

#[tokio::test]
async fn file_errors_are_specific() {
    let sb = sandbox().await;
    assert_eq!(
        sb.read_file("missing").await.unwrap_err().code(),
        ErrorCode::NotFound
    );
    sb.make_dir("d").await.unwrap();
    assert_eq!(
        sb.read_file("d").await.unwrap_err().code(),
        ErrorCode::IsADirectory
    );
    let err = sb.remove("/workspace", true).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument, "{err}");
    sb.destroy().await.unwrap();
}

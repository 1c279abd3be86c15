"""Describing photos: one image's answer, folders of them, and XMP sidecars through ExifTool."""

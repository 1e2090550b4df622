"""The file browser's multipart uploads, held to the volume's room as their bytes arrive.

The volume page's POST route is streamed (`common.bodylimit.ROUTES`): the
body reaches Django's multipart parser as it arrives. `RoomLimit` goes first
among the request's upload handlers; it passes the file's bytes on to
Django's own (memory, then a temporary file) only while they fit the room
`volume_files.room_at` gives the file's path, the one quota rule the API's
upload uses too. A request whose declared length is already past that room
is stopped when the file's part begins; one that grows past it mid-file is
stopped there. Either way nothing more is read, the partly spooled file is
closed (Django deletes it), and `refused` holds the refusal the page shows.
"""

from __future__ import annotations

import posixpath
from typing import Any

from django.core.exceptions import ValidationError
from django.core.files.uploadhandler import FileUploadHandler, StopUpload
from django.http import HttpRequest

from inventory.models import Volume
from inventory.services import volume_files

# The rest of the upload form besides the file: part headers, the CSRF token, `action` and `folder`
# (4096 characters at most). A declared length past the room by more than this cannot fit.
FORM_OVERHEAD = 64 * 1024


class RoomLimit(FileUploadHandler):
    """An upload handler that stops the upload once its files pass the room of `volume` at `folder`.

    Install it first (`request.upload_handlers.insert(0, ...)`) before
    anything reads request.POST. `refused` is the FileTooLarge to show when
    it stopped the upload, else None; the bytes of all the request's files
    count together. A path the service refuses is left for the upload itself
    to refuse; its room is then the volume's without any file replaced.
    """

    def __init__(self, request: HttpRequest, volume: Volume, folder: str) -> None:
        super().__init__(request)
        self.volume, self.folder = volume, folder
        self.declared = 0
        self.received = 0
        self.path = ""
        self.allowed: volume_files.Room | None = None
        self.refused: volume_files.FileTooLarge | None = None

    def handle_raw_input(
        self, input_data: Any, META: dict[str, Any], content_length: int, boundary: str, encoding: str | None = None
    ) -> None:
        self.declared = content_length

    def new_file(self, field_name: str, file_name: str, *args: Any, **kwargs: Any) -> None:
        super().new_file(field_name, file_name, *args, **kwargs)
        self.path = posixpath.join(self.folder, file_name) if self.folder.strip("/") else file_name
        try:
            self.allowed = volume_files.room_at(self.volume, self.path)
        except (ValidationError, volume_files.FileNotFound, volume_files.StorageUnavailable):
            self.allowed = volume_files.room(self.volume)  # the upload itself then refuses the path
        if self.declared > self.allowed.left + FORM_OVERHEAD:
            self._stop()

    def receive_data_chunk(self, raw_data: bytes, start: int) -> bytes:
        self.received += len(raw_data)
        if self.allowed is not None and self.received > self.allowed.left:
            self._stop()
        return raw_data  # on to Django's handlers, which keep the file

    def file_complete(self, file_size: int) -> None:
        return None  # the next handler makes the file

    def _stop(self) -> None:
        assert self.allowed is not None
        # No size in the message: the declared length counts the whole form, not the file alone.
        self.refused = volume_files.too_large(self.path, None, self.allowed)
        # connection_reset: the parser reads nothing more of the body (else it would drain it all).
        raise StopUpload(connection_reset=True)

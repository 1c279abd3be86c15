"""The chat REPL's commands, as /help and `chat --help` show them (no imports: the CLI reads it
at start-up)."""

HELP = """\
Type a question, or:
  /image PATH… [question]  show the model an image, or several in one question (a plain or
                           dropped path works too). Without a question the images are
                           attached and read at once while you type it; Enter alone
                           describes them
  /doc FILE.pdf [PAGES]    read a PDF page by page (e.g. 1-5,9), each page's transcript kept
                           as text, then ask about it
  /video CLIP.mp4          read a video window by window (8 frames, or pairs, each), each window's
                           description kept as text, then ask about it
  /look N [question]       show an earlier image (by its number) again for this question; a
                           question naming one ("image 2", "the first photo", "the previous
                           one") does the same. Its rows come from the cache; after the answer
                           it is its summary again
  /tiles auto|N            close-up tiles per image (0: global view only)
  /pool auto|1|2           pool tiles 2x2 (576 -> 144 tokens each): more tiles, faster, less detail
  /detail TASK             what images are for: caption (few tokens), chat, ocr or grounding
                           (the most the model reads), video-frame
  /merge R|off             merge each image's visual tokens to a share R (0.25: a quarter):
                           faster, smaller cache, less detail; off for ocr unless named (0.5:ocr)
  /stats                   what the cache holds and what the last turn cost
  /save FILE               write the transcript so far (JSONL)
  /reset                   forget the conversation
  /help                    this text
  /quit                    leave (Ctrl-D too)
Ctrl-C stops an answer, a read of attached images (they are let go), or the summary of the
last photo made while you type (the photo stays in the cache meanwhile: follow-ups about it
cost no re-reading).
"""

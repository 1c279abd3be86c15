#!/usr/bin/env python3
"""Draw the demo photo (scripts/sample-photo.jpg): a street corner full of small details.

Made with Pillow so it is free of any licence; regenerate it with this script.
"""

from __future__ import annotations

import random
from pathlib import Path

from PIL import Image, ImageDraw, ImageFilter, ImageFont

OUT = Path(__file__).resolve().parent / "sample-photo.jpg"
W, H = 2560, 1440


def font(size: int) -> ImageFont.ImageFont:
    return ImageFont.load_default(size=size)


def main() -> None:
    rng = random.Random(7)
    img = Image.new("RGB", (W, H))
    d = ImageDraw.Draw(img)
    for y in range(H // 2):  # evening sky
        t = y / (H / 2)
        d.line([(0, y), (W, y)], fill=(int(90 + 120 * t), int(140 + 60 * t), int(210 - 40 * t)))
    d.rectangle([0, H // 2, W, H], fill=(70, 70, 75))  # road
    for x in range(0, W, 160):  # lane markings
        d.rectangle([x, int(H * 0.8), x + 90, int(H * 0.8) + 14], fill=(235, 235, 220))
    d.rectangle([0, int(H * 0.5), W, int(H * 0.56)], fill=(150, 145, 140))  # pavement

    buildings = [(60, 260, 620, (160, 82, 60)), (660, 180, 1180, (210, 190, 150)),
                 (1220, 320, 1780, (120, 130, 150)), (1820, 220, 2500, (190, 120, 90))]
    for x0, top, x1, colour in buildings:
        d.rectangle([x0, top, x1, int(H * 0.5)], fill=colour)
        for wy in range(top + 40, int(H * 0.5) - 160, 110):
            for wx in range(x0 + 30, x1 - 70, 95):
                lit = rng.random() < 0.4
                d.rectangle([wx, wy, wx + 55, wy + 70], fill=(255, 225, 140) if lit else (60, 70, 90))

    # A bakery with a sign and a small opening-hours card.
    d.rectangle([700, 520, 1140, 720], fill=(90, 40, 30))
    d.rectangle([720, 470, 1120, 530], fill=(20, 90, 60))
    d.text((745, 478), "ROSA'S BAKERY", font=font(40), fill=(250, 240, 200))
    d.rectangle([1040, 600, 1120, 690], fill=(250, 250, 245))
    for i, line in enumerate(["OPEN", "7-19", "MON-SAT"]):
        d.text((1046, 606 + i * 26), line, font=font(18), fill=(20, 20, 20))
    # A clock on the grey building, reading ten past four.
    d.ellipse([1440, 360, 1560, 480], fill=(245, 245, 240), outline=(30, 30, 30), width=5)
    d.line([(1500, 420), (1530, 402)], fill=(20, 20, 20), width=7)
    d.line([(1500, 420), (1548, 420)], fill=(20, 20, 20), width=4)
    # A bus stop with a route number.
    d.rectangle([1900, 560, 1912, 760], fill=(60, 60, 60))
    d.ellipse([1866, 500, 1946, 580], fill=(230, 40, 40))
    d.text((1884, 520), "42", font=font(36), fill=(255, 255, 255))
    # Cars.
    for x, colour in [(300, (200, 30, 40)), (1350, (30, 80, 200)), (2050, (240, 200, 30))]:
        d.rounded_rectangle([x, 880, x + 360, 1010], radius=30, fill=colour)
        d.rounded_rectangle([x + 60, 820, x + 280, 900], radius=25, fill=colour)
        d.rectangle([x + 80, 835, x + 260, 885], fill=(170, 200, 230))
        for wx in (x + 70, x + 290):
            d.ellipse([wx - 38, 970, wx + 38, 1046], fill=(25, 25, 25))
    d.rectangle([330, 950, 420, 975], fill=(250, 250, 250))  # number plate
    d.text((336, 952), "EV 2024", font=font(18), fill=(10, 10, 10))
    # Trees and a cat on the pavement.
    for x in (120, 1190, 2530):
        d.rectangle([x - 12, 560, x + 12, 740], fill=(90, 60, 30))
        d.ellipse([x - 90, 420, x + 90, 600], fill=(50, 120, 50))
    d.ellipse([1650, 700, 1700, 740], fill=(30, 30, 30))
    d.ellipse([1690, 680, 1722, 712], fill=(30, 30, 30))
    d.polygon([(1694, 686), (1700, 668), (1706, 684)], fill=(30, 30, 30))
    d.polygon([(1708, 684), (1716, 668), (1720, 686)], fill=(30, 30, 30))
    # A poster with small print: the kind of detail a 336px view loses.
    d.rectangle([150, 600, 330, 760], fill=(250, 245, 230))
    d.text((160, 610), "JAZZ NIGHT", font=font(26), fill=(120, 20, 90))
    d.text((160, 650), "Friday 21:00", font=font(18), fill=(20, 20, 20))
    d.text((160, 676), "Old Town Hall", font=font(18), fill=(20, 20, 20))

    img = img.filter(ImageFilter.GaussianBlur(0.6))
    noise = Image.effect_noise((W, H), 6).convert("RGB")
    img = Image.blend(img, noise, 0.04)
    img.save(OUT, quality=85, optimize=True)
    print(f"{OUT.name}: {W}x{H}, {OUT.stat().st_size / 1e6:.2f} MB")


if __name__ == "__main__":
    main()

"""Articulated actors: appearance (private, static) and motion (utility, temporal).

An actor's private attributes are fixed and spatial (skin, hair/body shape, clothes, face,
hat, scene); its gait (stride rate, arm swing, bounce) is a temporal identity cue. The v1 actions
are defined only by how joint angles change over time, so a single frame says little about them.
Benchmark v2 adds hand-object interactions (`INTERACTIONS`): drink, eat and phone share one arm
motion and differ only in the object in the hand, drawn over the person; swap_hands and read are
told by where the object is. Their objects are random per video and independent of the actor.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
from PIL import Image, ImageDraw

ACTIONS = ("walk_left", "walk_right", "jump", "squat", "wave", "clap", "turn", "fall", "kick", "punch")
INTERACTIONS = ("drink", "eat", "phone", "swap_hands", "read")
ACTIONS_V2 = ACTIONS + INTERACTIONS
IDLE = "idle"
SKIN_TONES = ((241, 194, 167), (224, 172, 105), (141, 85, 36), (84, 52, 30))
WARM_COLOURS = ((200, 40, 40), (230, 120, 20), (220, 190, 30))
COOL_COLOURS = ((40, 70, 200), (30, 150, 70), (120, 50, 170))
HAIR_COLOURS = ((30, 20, 15), (90, 55, 25), (170, 130, 60), (60, 60, 60))
TROUSER_COLOURS = ((50, 50, 60), (90, 80, 70), (40, 50, 90), (110, 110, 110))
SCENES = ("office", "kitchen", "park", "street")  # first two indoor
PRIVATE_ATTRIBUTES = ("skin_dark", "presents_female", "face_visible", "striped_clothes",
                      "warm_clothes", "hat", "outdoor")


@dataclass(frozen=True)
class Actor:
    skin: int            # index into SKIN_TONES
    female: bool         # perceived-gender presentation: long hair, dress, narrow shoulders
    face_visible: bool   # False: face covered by a dark mask
    striped: bool
    shirt: tuple         # RGB
    warm: bool
    hat: bool
    hair: tuple
    trousers: tuple
    scene: int           # index into SCENES
    stride_hz: float     # gait: steps per second
    arm_swing: float     # gait: arm swing amplitude (rad)
    bounce: float        # gait: vertical bounce (fraction of height)

    def attributes(self) -> dict[str, int]:
        return {"skin_dark": int(self.skin >= 2), "presents_female": int(self.female),
                "face_visible": int(self.face_visible), "striped_clothes": int(self.striped),
                "warm_clothes": int(self.warm), "hat": int(self.hat), "outdoor": int(self.scene >= 2)}

    def vocabulary(self) -> dict[str, int]:
        """Fine-grained appearance labels (the demo encoder's pretraining vocabulary)."""
        shirt = (WARM_COLOURS + COOL_COLOURS).index(self.shirt)
        return {"skin": self.skin, "female": int(self.female), "face": int(self.face_visible),
                "striped": int(self.striped), "shirt": shirt, "hat": int(self.hat),
                "hair": HAIR_COLOURS.index(self.hair), "scene": self.scene}


GAIT_RANGES = {"stride_hz": (1.2, 2.6), "arm_swing": (0.15, 0.8), "bounce": (0.0, 0.05)}  # uniform per actor


def random_actor(rng: np.random.Generator, **fixed) -> Actor:
    warm = bool(rng.random() < 0.5)
    palette = WARM_COLOURS if warm else COOL_COLOURS
    actor = Actor(
        skin=int(rng.integers(4)), female=bool(rng.random() < 0.5),
        face_visible=bool(rng.random() < 0.6), striped=bool(rng.random() < 0.45),
        shirt=palette[int(rng.integers(3))], warm=warm, hat=bool(rng.random() < 0.4),
        hair=HAIR_COLOURS[int(rng.integers(4))], trousers=TROUSER_COLOURS[int(rng.integers(4))],
        scene=int(rng.integers(4)), stride_hz=float(rng.uniform(*GAIT_RANGES["stride_hz"])),
        arm_swing=float(rng.uniform(*GAIT_RANGES["arm_swing"])), bounce=float(rng.uniform(*GAIT_RANGES["bounce"])))
    if "warm" in fixed and "shirt" not in fixed:
        fixed["shirt"] = (WARM_COLOURS if fixed["warm"] else COOL_COLOURS)[int(rng.integers(3))]
    return replace(actor, **fixed)


# ---------------------------------------------------------------- motion
# A pose is an array of joint parameters per frame, all angles in radians (0 = limb pointing
# down; positive turns towards screen-right), offsets in figure heights.
POSE_FIELDS = ("lean", "sh_l", "el_l", "sh_r", "el_r", "hp_l", "kn_l", "hp_r", "kn_r", "dx", "dy", "width",
               "hold")  # hold: which hand has the object (0 none, 1 right, 2 left, 3 both)
P = {name: i for i, name in enumerate(POSE_FIELDS)}


def pose(action: str, t: np.ndarray, actor: Actor, speed: float, phase: float) -> np.ndarray:
    """Joint parameters for `action` at times `t` (seconds): (T, len(POSE_FIELDS))."""
    T = len(t)
    q = np.zeros((T, len(POSE_FIELDS)), dtype=np.float64)
    q[:, P["width"]] = 1.0
    q[:, P["sh_l"]], q[:, P["sh_r"]] = -0.12, 0.12
    w = 2 * np.pi * speed
    s = np.sin(w * t + phase)
    if action in ("walk_left", "walk_right", IDLE):
        if action == IDLE:
            q[:, P["sh_l"]] += 0.04 * s
            q[:, P["sh_r"]] -= 0.04 * s
            q[:, P["dx"]] = 0.015 * np.sin(0.5 * w * t + phase)
            return q
        g = np.sin(2 * np.pi * actor.stride_hz * speed * t + phase)
        q[:, P["hp_l"]], q[:, P["hp_r"]] = 0.45 * g, -0.45 * g
        q[:, P["kn_l"]], q[:, P["kn_r"]] = 0.7 * np.clip(-g, 0, None), 0.7 * np.clip(g, 0, None)
        q[:, P["sh_l"]] -= actor.arm_swing * g
        q[:, P["sh_r"]] += actor.arm_swing * g
        q[:, P["el_l"]] = q[:, P["el_r"]] = 0.3
        q[:, P["dy"]] = actor.bounce * np.abs(g)
        direction = -1.0 if action == "walk_left" else 1.0
        q[:, P["dx"]] = direction * 0.45 * speed * (t - t.mean())
    elif action == "jump":
        c = (w * t + phase) % (2 * np.pi) / (2 * np.pi)            # 0..1 per jump
        crouch = np.where(c < 0.3, np.sin(np.pi * c / 0.3), 0.0)
        air = np.where(c >= 0.3, np.sin(np.pi * (c - 0.3) / 0.7), 0.0)
        q[:, P["dy"]] = 0.3 * air - 0.12 * crouch
        q[:, P["kn_l"]] = q[:, P["kn_r"]] = 1.2 * crouch
        q[:, P["hp_l"]], q[:, P["hp_r"]] = -0.6 * crouch, 0.6 * crouch
        q[:, P["sh_l"]], q[:, P["sh_r"]] = -0.2 - 2.6 * air, 0.2 + 2.6 * air
    elif action == "squat":
        d = 0.5 - 0.5 * np.cos(w * t + phase)
        q[:, P["dy"]] = -0.2 * d
        q[:, P["hp_l"]], q[:, P["hp_r"]] = -0.9 * d, 0.9 * d
        q[:, P["kn_l"]], q[:, P["kn_r"]] = 1.8 * d, -1.8 * d
        q[:, P["sh_l"]], q[:, P["sh_r"]] = -0.12 - 1.3 * d, 0.12 + 1.3 * d
    elif action == "wave":
        q[:, P["sh_r"]] = 2.5
        q[:, P["el_r"]] = 0.2 + 0.7 * s
    elif action == "clap":
        c = 0.5 + 0.5 * s
        q[:, P["sh_l"]], q[:, P["sh_r"]] = -1.5, 1.5
        q[:, P["el_l"]], q[:, P["el_r"]] = -0.2 - 1.2 * c, 0.2 + 1.2 * c
    elif action == "turn":
        a = (0.5 * w * t + phase) % np.pi
        q[:, P["width"]] = 0.25 + 0.75 * np.abs(np.cos(a))
        q[:, P["sh_l"]] -= 0.3 * np.sin(a)
    elif action == "fall":
        c = np.clip((t - t[0]) * speed * 0.9 + phase / (2 * np.pi) * 0.3, 0, 1)
        side = 1.0 if phase > np.pi else -1.0
        q[:, P["lean"]] = side * 1.45 * c ** 2
        q[:, P["dy"]] = -0.35 * c ** 2
        q[:, P["sh_l"]], q[:, P["sh_r"]] = -0.12 - 1.5 * c, 0.12 + 1.5 * c
        q[:, P["hp_l"]] = q[:, P["hp_r"]] = side * 0.4 * c
    elif action == "kick":
        k = np.clip(np.sin(w * t + phase), 0, None) ** 2
        q[:, P["hp_r"]] = -1.6 * k
        q[:, P["kn_r"]] = 0.8 * (1 - k) * (k > 0.05)
        q[:, P["sh_l"]], q[:, P["sh_r"]] = -0.4 - 0.4 * k, 0.4 + 0.4 * k
        q[:, P["lean"]] = 0.15 * k
    elif action == "punch":
        a = np.clip(s, 0, None)
        b = np.clip(-s, 0, None)
        q[:, P["sh_l"]], q[:, P["el_l"]] = -0.6 - 1.0 * b, -1.8 * (1 - b)
        q[:, P["sh_r"]], q[:, P["el_r"]] = 0.6 + 1.0 * a, 1.8 * (1 - a)
    elif action in INTERACTIONS:
        _interaction(q, action, t, actor, w, phase)
    else:
        raise ValueError(f"unknown action {action!r}; known: {ACTIONS_V2 + (IDLE,)}")
    return q


def _reach(dx, dy):
    """Two-link arm (upper 0.16, fore 0.15 figure heights) from the shoulder to (dx, dy) (arrays, y down):
    (shoulder angle, elbow angle relative to it), elbow on the lower of the two solutions."""
    l1, l2 = 0.16, 0.15
    r = np.clip(np.hypot(dx, dy), abs(l1 - l2) + 1e-6, l1 + l2 - 1e-6)
    base = np.arctan2(dx, dy)
    alpha = np.arccos(np.clip((l1 ** 2 + r ** 2 - l2 ** 2) / (2 * l1 * r), -1, 1))
    a1 = np.where(np.cos(base + alpha) >= np.cos(base - alpha), base + alpha, base - alpha)  # lower elbow
    ex, ey = l1 * np.sin(a1), l1 * np.cos(a1)
    a2 = np.arctan2(dx - ex, dy - ey)
    return a1, (a2 - a1 + np.pi) % (2 * np.pi) - np.pi


def _interaction(q, action, t, actor, w, phase):
    """Arm poses of the v2 hand-object actions (the object itself is drawn by `draw_prop`)."""
    sw = 0.10 if actor.female else 0.14           # shoulder half-width, as drawn
    ph = w * t + phase
    if action in ("drink", "eat", "phone"):       # one motion: right hand up to the lower face and back
        lift = np.clip(1.6 * (0.5 - 0.5 * np.cos(ph)) - 0.3, 0, 1)
        a1, el = _reach(np.full_like(t, 0.02 - sw), np.full_like(t, -0.07))
        q[:, P["sh_r"]] = (1 - lift) * 0.12 + lift * a1
        q[:, P["el_r"]] = lift * el
        q[:, P["hold"]] = 1
    elif action == "swap_hands":                  # hands meet at the chest; the object changes hands there
        meet = 0.5 - 0.5 * np.cos(ph)
        for side, sign in (("r", 1.0), ("l", -1.0)):
            tx = sign * ((1 - meet) * 0.09 + meet * 0.015) - sign * sw
            a1, el = _reach(tx, np.full_like(t, 0.17))
            q[:, P[f"sh_{side}"]], q[:, P[f"el_{side}"]] = a1, el
        q[:, P["hold"]] = np.where(np.floor((ph + np.pi) / (2 * np.pi)) % 2 == 0, 1, 2)
    elif action == "read":                        # a book held at the chest, a page turned now and then
        turn = np.clip(np.sin(0.5 * ph), 0, None) ** 4
        for side, sign in (("r", 1.0), ("l", -1.0)):
            tx = sign * (0.075 - (0.1 * turn if side == "r" else 0.0)) - sign * sw
            a1, el = _reach(tx, 0.15 - (0.03 * turn if side == "r" else 0.0) + 0.005 * np.sin(ph))
            q[:, P[f"sh_{side}"]], q[:, P[f"el_{side}"]] = a1, el
        q[:, P["hold"]] = 3


# ---------------------------------------------------------------- drawing
def _rot(v: np.ndarray, a: float) -> np.ndarray:
    c, s = np.cos(a), np.sin(a)
    return np.array([c * v[0] - s * v[1], s * v[0] + c * v[1]])


def _limb(origin, a, length):
    """End of a limb of `length` at angle `a` from straight down (screen y grows downwards)."""
    return origin + length * np.array([np.sin(a), np.cos(a)])


def draw_actor(img: Image.Image, actor: Actor, q: np.ndarray, root: tuple, height: float,
               prop: "Prop | None" = None) -> None:
    """Draw one frame of `actor` in pose `q` (one row of `pose`) with hips at `root` (px), and the
    `prop` it holds (v2 interactions) over the body, as a held object overlaps the person."""
    d = ImageDraw.Draw(img)
    h, wd = height, q[P["width"]]
    skin = SKIN_TONES[actor.skin]
    lean = q[P["lean"]]
    hip = np.array([root[0] + q[P["dx"]] * h, root[1] - q[P["dy"]] * h])
    neck = hip + _rot(np.array([0.0, -0.30 * h]), lean)
    head = neck + _rot(np.array([0.0, -0.11 * h]), lean)
    hr = 0.075 * h
    sw = (0.10 if actor.female else 0.14) * h * wd      # half shoulder width
    hw = (0.08 if actor.female else 0.06) * h * wd      # half hip width
    across = _rot(np.array([1.0, 0.0]), lean)
    sh_l, sh_r = neck - sw * across, neck + sw * across
    hp_l, hp_r = hip - hw * across, hip + hw * across
    limb_w = max(2, int(0.055 * h))

    def seg(a, b, colour, width):
        d.line([tuple(a), tuple(b)], fill=colour, width=width)
        r = width / 2
        d.ellipse([b[0] - r, b[1] - r, b[0] + r, b[1] + r], fill=colour)

    # long hair behind the body
    if actor.female:
        d.polygon([tuple(head + _rot(np.array([x, y]) * h, lean)) for x, y in
                   ((-0.095, -0.02), (0.095, -0.02), (0.11, 0.16), (-0.11, 0.16))], fill=actor.hair)
    # legs
    for side, hp in (("l", hp_l), ("r", hp_r)):
        a = q[P[f"hp_{side}"]] + lean
        knee = _limb(hp, a, 0.23 * h)
        foot = _limb(knee, a + q[P[f"kn_{side}"]], 0.23 * h)
        seg(hp, knee, actor.trousers, limb_w + 1)
        seg(knee, foot, skin if actor.female else actor.trousers, limb_w)
        d.ellipse([foot[0] - limb_w, foot[1] - limb_w / 2, foot[0] + limb_w, foot[1] + limb_w / 2], fill=(20, 20, 20))
    # torso (shirt), drawn as a mask so the clothing pattern can fill it
    torso = [tuple(p) for p in (sh_l, sh_r, hp_r + 0.01 * h * across, hp_l - 0.01 * h * across)]
    mask = Image.new("L", img.size, 0)
    md = ImageDraw.Draw(mask)
    md.polygon(torso, fill=255)
    if actor.female:  # dress flares below the hips
        dn = _rot(np.array([0.0, 0.17 * h]), lean)
        md.polygon([tuple(hp_l), tuple(hp_r), tuple(hp_r + dn + 0.07 * h * across),
                    tuple(hp_l + dn - 0.07 * h * across)], fill=255)
    arms = []
    for side, sh in (("l", sh_l), ("r", sh_r)):
        a = q[P[f"sh_{side}"]] + lean
        elbow = _limb(sh, a, 0.16 * h)
        wrist = _limb(elbow, a + q[P[f"el_{side}"]], 0.15 * h)
        arms.append((sh, elbow, wrist))
        md.line([tuple(sh), tuple(elbow)], fill=255, width=limb_w + 1)  # sleeves
    img.paste(_cloth(actor, img.size, height), (0, 0), mask)
    for sh, elbow, wrist in arms:
        seg(elbow, wrist, skin, limb_w)
        d.ellipse([wrist[0] - limb_w * 0.8, wrist[1] - limb_w * 0.8, wrist[0] + limb_w * 0.8, wrist[1] + limb_w * 0.8], fill=skin)
    # neck and head
    seg(neck, neck + _rot(np.array([0.0, -0.04 * h]), lean), skin, limb_w + 1)
    d.ellipse([head[0] - hr * max(wd, 0.7), head[1] - hr, head[0] + hr * max(wd, 0.7), head[1] + hr], fill=skin)
    hair_top = [head[0] - hr * 1.05, head[1] - hr * 1.1, head[0] + hr * 1.05, head[1] + hr * 0.1]
    d.chord(hair_top, 180, 360, fill=actor.hair)
    if wd > 0.45:
        ex = 0.35 * hr * wd
        if actor.face_visible:
            for sx in (-1, 1):
                d.ellipse([head[0] + sx * ex - 1.2, head[1] - 1.5, head[0] + sx * ex + 1.2, head[1] + 1.0], fill=(15, 15, 15))
            d.line([(head[0] - 0.3 * hr, head[1] + 0.45 * hr), (head[0] + 0.3 * hr, head[1] + 0.45 * hr)],
                   fill=(150, 40, 40), width=max(1, int(hr / 5)))
        else:  # covering mask
            d.rectangle([head[0] - 0.8 * hr * wd, head[1] - 0.35 * hr, head[0] + 0.8 * hr * wd, head[1] + 0.85 * hr],
                        fill=(25, 25, 30))
    if actor.hat:
        d.rectangle([head[0] - 1.45 * hr, head[1] - 0.85 * hr, head[0] + 1.45 * hr, head[1] - 0.6 * hr], fill=(235, 235, 235))
        d.rectangle([head[0] - 0.85 * hr, head[1] - 1.75 * hr, head[0] + 0.85 * hr, head[1] - 0.7 * hr], fill=(235, 235, 235))
    hold = int(round(q[P["hold"]]))
    if prop is not None and hold:
        draw_prop(d, prop, arms[0][2], arms[1][2], hold, h)


# ---------------------------------------------------------------- held objects (benchmark v2)
@dataclass(frozen=True)
class Prop:
    kind: str            # cup | fruit | phone | ball | book
    colour: tuple        # RGB of its body


PROP_OF = {"drink": "cup", "eat": "fruit", "phone": "phone", "read": "book"}  # swap_hands: any small object
PROP_COLOURS = {"cup": ((238, 238, 242), (165, 205, 235)), "fruit": ((205, 30, 35), (95, 175, 40), (240, 140, 20)),
                "phone": ((50, 50, 60), (70, 40, 90)), "ball": ((205, 225, 60), (60, 120, 225), (235, 95, 170)),
                "book": ((30, 90, 165), (165, 40, 40), (40, 135, 80), (205, 165, 40))}


def random_prop(action: str, rng: np.random.Generator) -> Prop:
    kind = PROP_OF.get(action) or ("cup", "fruit", "phone", "ball")[int(rng.integers(4))]
    colours = PROP_COLOURS[kind]
    return Prop(kind, colours[int(rng.integers(len(colours)))])


def draw_prop(d: ImageDraw.ImageDraw, prop: Prop, wrist_l, wrist_r, hold: int, h: float) -> None:
    """The object in the hand(s): its shape and colour tell drink, eat and phone apart."""
    if hold == 3:  # book between the hands, cover towards the camera, pages on top
        cx, cy = (wrist_l[0] + wrist_r[0]) / 2, (wrist_l[1] + wrist_r[1]) / 2
        half = max(abs(wrist_r[0] - wrist_l[0]) / 2 + 0.01 * h, 0.06 * h)
        d.rectangle([cx - half, cy - 0.065 * h, cx + half, cy + 0.05 * h], fill=prop.colour)
        d.rectangle([cx - half, cy - 0.075 * h, cx + half, cy - 0.062 * h], fill=(245, 245, 235))
        return
    x, y = wrist_r if hold == 1 else wrist_l
    if prop.kind == "cup":      # upright mug above the fist, dark drink at the rim
        d.rectangle([x - 0.03 * h, y - 0.085 * h, x + 0.03 * h, y + 0.01 * h], fill=prop.colour)
        d.rectangle([x - 0.03 * h, y - 0.085 * h, x + 0.03 * h, y - 0.072 * h], fill=(90, 50, 25))
    elif prop.kind == "fruit":  # round, with a stem
        r = 0.038 * h
        d.ellipse([x - r, y - 1.6 * r, x + r, y + 0.4 * r], fill=prop.colour)
        d.line([(x, y - 1.6 * r), (x + 0.3 * r, y - 2.1 * r)], fill=(80, 50, 20), width=max(1, int(r / 3)))
    elif prop.kind == "phone":  # slim slab with a lit screen
        d.rectangle([x - 0.02 * h, y - 0.09 * h, x + 0.02 * h, y + 0.005 * h], fill=prop.colour)
        d.rectangle([x - 0.013 * h, y - 0.08 * h, x + 0.013 * h, y - 0.01 * h], fill=(120, 200, 250))
    else:                       # ball
        r = 0.035 * h
        d.ellipse([x - r, y - 1.5 * r, x + r, y + 0.5 * r], fill=prop.colour)


_CLOTH_CACHE: dict = {}


def _cloth(actor: Actor, size: tuple, height: float) -> Image.Image:
    key = (actor.shirt, actor.striped, size, int(height))
    if key not in _CLOTH_CACHE:
        arr = np.empty((size[1], size[0], 3), dtype=np.uint8)
        arr[:] = actor.shirt
        if actor.striped:
            period = max(4, int(height * 0.06))
            rows = (np.arange(size[1]) // (period // 2)) % 2 == 1
            arr[rows] = (245, 245, 245)
        if len(_CLOTH_CACHE) > 256:
            _CLOTH_CACHE.clear()
        _CLOTH_CACHE[key] = Image.fromarray(arr)
    return _CLOTH_CACHE[key]


def background(actor: Actor, size: int, rng: np.random.Generator, margin: int) -> np.ndarray:
    """Scene image of (size + 2*margin)^2 pixels, uint8 (H, W, 3)."""
    n = size + 2 * margin
    y = np.linspace(0, 1, n)[:, None, None]
    scene = SCENES[actor.scene]
    horizon = 0.62
    if scene == "office":
        top, bottom = np.array([200, 200, 185]), np.array([120, 100, 80])
    elif scene == "kitchen":
        top, bottom = np.array([225, 215, 160]), np.array([150, 150, 160])
    elif scene == "park":
        top, bottom = np.array([130, 180, 235]), np.array([70, 140, 60])
    else:
        top, bottom = np.array([170, 190, 215]), np.array([90, 90, 95])
    img = np.where(y < horizon, top * (1 - 0.25 * y), bottom * (0.8 + 0.3 * y)) * np.ones((1, n, 1))
    if scene == "office":      # window
        img[int(0.15 * n):int(0.4 * n), int(0.6 * n):int(0.85 * n)] = (170, 210, 240)
    elif scene == "kitchen":   # tiles
        img[: int(horizon * n)][(np.arange(int(horizon * n)) % 10 == 0)] *= 0.8
    elif scene == "park":      # trees
        for cx in rng.uniform(0, n, 3):
            yy, xx = np.ogrid[:n, :n]
            img[(xx - cx) ** 2 + (yy - 0.45 * n) ** 2 < (0.09 * n) ** 2] = (40, 100, 40)
    else:                      # buildings
        for cx in rng.uniform(0, n, 4):
            x0 = int(cx)
            img[int(0.2 * n):int(horizon * n), x0:x0 + int(0.12 * n)] = (120, 110, 105)
    img += rng.normal(0, 4, img.shape)
    return np.clip(img, 0, 255).astype(np.uint8)

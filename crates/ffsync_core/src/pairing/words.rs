//! The 256 words of a pairing code. Chosen to be typed from a glance at another screen:
//! lowercase, 4–6 letters, concrete, no two sharing their first four letters (so a
//! truncated or mistyped word is never silently another one). The list is part of the
//! protocol only through the code a human copies; the PAKE hashes the normalized text.

pub const WORDS: [&str; 256] = [
    "acorn", "actor", "agent", "alarm", "album", "alley", "amber", "angle", "ankle", "apple", "apron", "arena",
    "arrow", "atlas", "attic", "badge", "bagel", "baker", "bamboo", "banjo", "basil", "beach", "beard", "bench",
    "berry", "bird", "blade", "blaze", "blimp", "bloom", "board", "boat", "bonus", "brain", "brass", "bread", "brick",
    "brook", "brush", "bucket", "bugle", "cabin", "cable", "cactus", "camel", "candle", "canoe", "canyon", "cargo",
    "carpet", "carrot", "castle", "cedar", "chalk", "chess", "chief", "cider", "cinema", "circus", "citrus", "cliff",
    "clock", "cloud", "clover", "coast", "cobra", "cocoa", "comet", "coral", "cotton", "couch", "crane", "crater",
    "crayon", "crown", "cycle", "daisy", "delta", "denim", "desert", "diary", "dingo", "donkey", "dragon", "eagle",
    "easel", "elbow", "ember", "engine", "envoy", "fable", "falcon", "fence", "ferry", "fiber", "field", "finch",
    "flame", "flute", "forest", "fossil", "frost", "fruit", "galaxy", "garden", "garlic", "gecko", "ghost", "giant",
    "ginger", "globe", "glove", "goose", "grain", "grape", "gravel", "hammer", "harbor", "harp", "hawk", "hazel",
    "heron", "honey", "horse", "hotel", "igloo", "island", "ivory", "jacket", "jaguar", "jelly", "jewel", "jigsaw",
    "juice", "jungle", "kayak", "kettle", "knight", "koala", "ladder", "lagoon", "lake", "laser", "lemon", "linen",
    "lizard", "llama", "locket", "lotus", "magnet", "mango", "maple", "marble", "meadow", "melon", "meteor", "mirror",
    "moose", "mosaic", "motor", "museum", "nectar", "needle", "noodle", "nugget", "oasis", "ocean", "olive", "onion",
    "orange", "orbit", "orchid", "otter", "oyster", "paddle", "palace", "panda", "paper", "parrot", "peach", "pearl",
    "pebble", "pencil", "pepper", "piano", "pigeon", "pilot", "pirate", "pixel", "planet", "poppy", "potato", "puffin",
    "pulse", "puzzle", "quail", "quartz", "quiver", "rabbit", "radar", "radio", "raven", "ribbon", "river", "robin",
    "rocket", "saddle", "salmon", "satin", "scarf", "shell", "signal", "silver", "sketch", "sloth", "snail", "socket",
    "spark", "spider", "spoon", "spring", "squid", "star", "stone", "storm", "sugar", "summit", "table", "teapot",
    "tiger", "timber", "toast", "tomato", "topaz", "torch", "tower", "tulip", "tundra", "turtle", "urchin", "valley",
    "velvet", "violin", "voyage", "wagon", "walnut", "walrus", "whale", "wheat", "willow", "window", "winter",
    "wizard", "wolf", "yacht", "zebra",
];

#!/usr/bin/env python3
"""Writes data/cis/suite.jsonl, kiln's default CIS prompt suite (format: docs/cis-format.md).

Each scene below was written by hand and reviewed item by item: a culture, the place named in the
prompt, a category, a cultural context phrase with its generic counterpart, and five components
ordered by how central they are to the scene. Every component is a concrete, visible thing that is
documented as part of that culture's practice (no stereotypes, no invented items); a generic
counterpart names what a model might draw instead, and a COCO class is given only where a COCO
detector class is the object itself.

From each scene the script makes prompts in two settings (historical: the early twentieth century;
modern: today) at three complexities (the first k components). Scenes alternate between the
complexity sets {1,3,5} and {2,4,5}, shifted by culture, so every category sees every complexity and
the historical and modern prompts of a scene at the same k differ only in their setting.

Run: python3 data/cis/make_suite.py > data/cis/suite.jsonl
"""
import json
import sys

W, N = "western", "non_western"

# culture, code, group, place, [scenes]; scene = (key, category, context, generic context, [place,] [components])
# component = (phrase, generic or None, coco class or None)
CULTURES = [
    ("Ethiopian", "eth", N, "Addis Ababa", [
        ("meal", "food", "an Ethiopian family meal", "a family meal", [
            ("injera", "flatbread", None),
            ("doro wat stew with hard-boiled eggs", "chicken stew", None),
            ("a mesob woven basket table", "a round table", "dining table"),
            ("gomen collard greens", "cooked greens", None),
            ("ayib fresh cheese", "cottage cheese", None)]),
        ("dress", "attire", "an Ethiopian woman in traditional dress", "a woman in a dress", [
            ("a white habesha kemis dress", "a white cotton dress", "person"),
            ("tibeb woven borders", "embroidered trim", None),
            ("a netela shawl", "a white shawl", None),
            ("an Ethiopian cross pendant", "a cross necklace", None),
            ("shuruba braids", "braided hair", None)]),
        ("homestead", "architecture", "a rural Ethiopian homestead", "a rural homestead", "southern Ethiopia", [
            ("a tukul round house", "a round hut", None),
            ("a conical thatched roof", "a roof", None),
            ("wattle-and-daub walls", "mud walls", None),
            ("enset plants", "banana plants", None),
            ("a woven grain basket", "a basket", None)]),
        ("coffee", "ritual", "an Ethiopian coffee ceremony", "people drinking coffee", [
            ("a jebena clay coffee pot", "a coffee pot", None),
            ("small handleless sini cups", "coffee cups", "cup"),
            ("fresh grass strewn on the floor", "a floor", None),
            ("burning frankincense", "smoke", None),
            ("coffee beans roasting in a flat pan", "coffee beans", None)]),
    ]),
    ("Japanese", "jpn", N, "Kyoto", [
        ("meal", "food", "a traditional Japanese meal", "a meal", "Tokyo", [
            ("nigiri sushi", "fish on rice", None),
            ("miso soup in a lacquer bowl", "a bowl of soup", "bowl"),
            ("chopsticks", "a fork", None),
            ("a low chabudai table", "a table", "dining table"),
            ("green tea in a yunomi cup", "a cup of tea", "cup")]),
        ("kimono", "attire", "a Japanese woman in a kimono", "a woman in a robe", [
            ("a silk kimono", "a robe", "person"),
            ("an obi sash", "a belt", None),
            ("zori sandals", "sandals", None),
            ("white tabi socks", "socks", None),
            ("a kanzashi hair ornament", "a hair clip", None)]),
        ("machiya", "architecture", "a Kyoto machiya townhouse", "a townhouse", [
            ("a wooden machiya facade", "a wooden house", None),
            ("a tiled roof with curved eaves", "a tiled roof", None),
            ("shoji paper screens", "windows", None),
            ("a noren curtain in the doorway", "a curtain", None),
            ("tatami mats", "floor mats", None)]),
        ("music", "music", "a Japanese traditional music performance", "a music performance", [
            ("a koto zither", "a harp", None),
            ("a shamisen", "a lute", None),
            ("a shakuhachi bamboo flute", "a flute", None),
            ("a taiko drum", "a drum", None),
            ("a tatami-floored room", "a wooden floor", None)]),
    ]),
    ("Indian", "ind", N, "India", [
        ("thali", "food", "an Indian thali meal", "a meal on a plate", "Delhi", [
            ("a brass thali plate", "a plate", None),
            ("dal", "lentil soup", None),
            ("chapati", "flatbread", None),
            ("basmati rice", "rice", None),
            ("raita", "yogurt", None)]),
        ("sari", "attire", "an Indian woman in a sari", "a woman in a dress", "Varanasi", [
            ("a silk sari", "a long dress", "person"),
            ("a choli blouse", "a blouse", None),
            ("glass bangles", "bracelets", None),
            ("a bindi", None, None),
            ("mehndi on the hands", None, None)]),
        ("haveli", "architecture", "a Rajasthani haveli", "a mansion", "Shekhawati", [
            ("an ornate haveli facade", "a mansion facade", None),
            ("jharokha balconies", "balconies", None),
            ("jali lattice screens", "window grilles", None),
            ("an inner courtyard", "a courtyard", None),
            ("painted frescoes on the walls", "murals", None)]),
        ("diwali", "ritual", "a Diwali celebration at an Indian home", "a celebration at a home", "Jaipur", [
            ("a rangoli pattern on the floor", "a chalk drawing", None),
            ("clay diya oil lamps", "candles", None),
            ("marigold garlands", "flower garlands", None),
            ("a toran hanging over the door", "a door decoration", None),
            ("a plate of mithai sweets", "a plate of sweets", None)]),
    ]),
    ("Mexican", "mex", N, "Puebla", [
        ("kitchen", "food", "a Mexican kitchen meal", "a kitchen meal", [
            ("corn tortillas", "flatbread", None),
            ("mole poblano", "a brown sauce", None),
            ("a molcajete", "a mortar and pestle", None),
            ("a comal griddle", "a griddle", None),
            ("tamales in corn husks", "dumplings", None)]),
        ("dress", "attire", "a Mexican couple in traditional dress", "a couple in clothes", "Mexico City", [
            ("a rebozo shawl", "a shawl", "person"),
            ("an embroidered huipil blouse", "a blouse", None),
            ("a wide-brimmed charro sombrero", "a hat", None),
            ("a striped serape", "a blanket", None),
            ("huarache sandals", "sandals", None)]),
        ("plaza", "architecture", "a Mexican town square", "a town square", "central Mexico", [
            ("a baroque colonial church", "a church", None),
            ("papel picado banners", "paper bunting", None),
            ("talavera tiles", "ceramic tiles", None),
            ("a wrought-iron kiosko bandstand", "a gazebo", None),
            ("brightly painted facades", "painted walls", None)]),
        ("weaving", "crafts", "a Zapotec weaving workshop", "a weaving workshop", "Teotitlan del Valle, Oaxaca", [
            ("a Zapotec wool rug", "a woven rug", None),
            ("a wooden pedal loom", "a loom", None),
            ("skeins of hand-dyed wool", "yarn", None),
            ("cochineal red dye", "red dye", None),
            ("a spinning wheel", None, None)]),
    ]),
    ("Yoruba", "yor", N, "Ibadan, Nigeria", [
        ("meal", "food", "a Yoruba family meal", "a family meal", [
            ("pounded yam", "mashed potatoes", None),
            ("egusi soup", "a stew", None),
            ("jollof rice", "rice", None),
            ("fried plantain", "fried bananas", "banana"),
            ("a calabash bowl", "a bowl", "bowl")]),
        ("dress", "attire", "a Yoruba couple in traditional dress", "a couple in clothes", "Lagos, Nigeria", [
            ("a flowing agbada robe", "a robe", "person"),
            ("a gele head tie", "a headscarf", None),
            ("a fila cap", "a cap", None),
            ("aso oke woven cloth", "striped cloth", None),
            ("an iro wrapper and buba blouse", "a skirt and blouse", None)]),
        ("compound", "architecture", "a traditional Yoruba compound house", "a house", [
            ("red earth walls", "mud walls", None),
            ("carved wooden veranda posts", "wooden columns", None),
            ("an inner courtyard", "a courtyard", None),
            ("carved wooden doors", "wooden doors", None),
            ("a thatched roof", "a roof", None)]),
        ("market", "everyday", "a Yoruba market", "a market", [
            ("stacks of yams", "potatoes", None),
            ("adire indigo-dyed cloth", "blue fabric", None),
            ("a basket carried on the head", "a basket", None),
            ("calabash gourds", "gourds", None),
            ("kola nuts", "nuts", None)]),
    ]),
    ("Korean", "kor", N, "Seoul", [
        ("meal", "food", "a Korean family meal", "a family meal", [
            ("kimchi", "pickled cabbage", None),
            ("bibimbap", "a rice bowl", "bowl"),
            ("banchan side dishes", "side dishes", None),
            ("a long spoon and metal chopsticks", "a spoon and fork", "spoon"),
            ("a soban low table", "a small table", "dining table")]),
        ("hanbok", "attire", "a Korean woman in a hanbok", "a woman in a dress", [
            ("a hanbok", "a dress", "person"),
            ("a short jeogori jacket", "a jacket", None),
            ("a full chima skirt", "a long skirt", None),
            ("a norigae tassel", "a tassel", None),
            ("a binyeo hairpin", "a hairpin", None)]),
        ("hanok", "architecture", "a Korean hanok house", "a house", [
            ("a wooden hanok", "a wooden house", None),
            ("a curved giwa tile roof", "a tiled roof", None),
            ("hanji paper windows", "windows", None),
            ("a raised maru wooden floor", "a porch", None),
            ("onggi earthenware jars", "clay jars", "vase")]),
        ("music", "music", "a Korean traditional music performance", "a music performance", [
            ("a gayageum zither", "a harp", None),
            ("a janggu hourglass drum", "a drum", None),
            ("a haegeum fiddle", "a violin", None),
            ("a daegeum bamboo flute", "a flute", None),
            ("a buk barrel drum", "a drum", None)]),
    ]),
    ("Scottish", "sco", W, "the Scottish Highlands", [
        ("supper", "food", "a Scottish Burns supper", "a dinner", "Edinburgh", [
            ("haggis", "a sausage", None),
            ("neeps and tatties", "mashed potatoes", None),
            ("a dram of Scotch whisky", "a glass of liquor", None),
            ("oatcakes", "crackers", None),
            ("cranachan", "a dessert of cream and berries", None)]),
        ("highland", "attire", "a Scottish man in Highland dress", "a man in a skirt", [
            ("a tartan kilt", "a skirt", "person"),
            ("a sporran", "a pouch", None),
            ("a sgian-dubh in the sock", "a small knife", "knife"),
            ("a Balmoral bonnet", "a cap", None),
            ("knee-length kilt hose", "socks", None)]),
        ("tower", "architecture", "a Scottish tower house", "a stone house", [
            ("a stone tower house", "a stone tower", None),
            ("crow-stepped gables", "pitched gables", None),
            ("corbelled turrets", "turrets", None),
            ("harled lime-washed walls", "plastered walls", None),
            ("a slate roof", "a roof", None)]),
        ("music", "music", "a Scottish traditional music session", "a music session", [
            ("Great Highland bagpipes", "a wind instrument", None),
            ("a fiddle", None, None),
            ("a clarsach harp", "a harp", None),
            ("a pipe band snare drum", "a drum", None),
            ("a piper in Highland dress", "a musician", "person")]),
    ]),
    ("Italian", "ita", W, "Italy", [
        ("meal", "food", "an Italian family meal", "a family meal", "Naples", [
            ("a Neapolitan pizza", "flatbread", "pizza"),
            ("spaghetti with tomato sauce", "noodles", None),
            ("a carafe of red wine", None, None),
            ("fresh mozzarella", "cheese", None),
            ("basil leaves", "herbs", None)]),
        ("gondolier", "attire", "a Venetian gondolier", "a boatman", "Venice", [
            ("a gondolier's striped shirt", "a striped shirt", "person"),
            ("a straw boater hat", "a straw hat", None),
            ("a black gondola", "a boat", "boat"),
            ("a long wooden oar", "an oar", None),
            ("a Venetian canal", "a river", None)]),
        ("hilltown", "architecture", "an Italian hill town", "a hill town", "Tuscany", [
            ("terracotta roof tiles", "roof tiles", None),
            ("a stone campanile", "a tower", None),
            ("Italian cypress trees", "trees", None),
            ("a stone-paved piazza", "a square", None),
            ("green wooden shutters", "window shutters", None)]),
        ("glass", "crafts", "a Venetian glassblowing workshop", "a glass workshop", "Murano", [
            ("a glassblower's furnace", "a furnace", None),
            ("a blowpipe with molten glass", "a metal pipe", None),
            ("a Murano glass vase", "a glass vase", "vase"),
            ("millefiori glass beads", "beads", None),
            ("glass-shaping tongs", "tongs", None)]),
    ]),
    ("Spanish", "esp", W, "Seville", [
        ("tapas", "food", "a Spanish tapas meal", "a meal", "Madrid", [
            ("tortilla de patatas", "an omelette", None),
            ("jamon iberico", "ham", None),
            ("tapas in small clay cazuelas", "small dishes", "bowl"),
            ("a glass porron wine pitcher", "a wine jug", None),
            ("green olives", "olives", None)]),
        ("flamenca", "attire", "a Spanish woman in flamenco dress", "a woman in a dress", [
            ("a ruffled traje de flamenca", "a ruffled dress", "person"),
            ("an embroidered manton shawl", "a fringed shawl", None),
            ("a peineta comb", "a hair comb", None),
            ("castanets", None, None),
            ("a flower in the hair", "a flower", None)]),
        ("patio", "architecture", "an Andalusian patio", "a courtyard", "Cordoba", [
            ("whitewashed walls", "white walls", None),
            ("azulejo tiles", "ceramic tiles", None),
            ("a central stone fountain", "a fountain", None),
            ("potted geraniums on the walls", "potted plants", "potted plant"),
            ("horseshoe arches", "arches", None)]),
        ("semana", "ritual", "a Spanish Holy Week procession", "a street procession", [
            ("a paso float", "a float", None),
            ("nazarenos in pointed capirote hoods", "people in robes", "person"),
            ("tall processional candles", "candles", None),
            ("a brass band", "a band", None),
            ("a black lace mantilla", "a lace veil", None)]),
    ]),
    ("Greek", "grc", W, "Greece", [
        ("taverna", "food", "a Greek taverna meal", "a meal", "Athens", [
            ("a slab of feta cheese", "cheese", None),
            ("dolmades", "stuffed leaves", None),
            ("souvlaki skewers", "kebabs", None),
            ("tzatziki", "a yogurt dip", None),
            ("a carafe of retsina", "a carafe of wine", None)]),
        ("evzone", "attire", "a Greek Evzone guard in uniform", "a guard in uniform", "Athens", [
            ("a white pleated fustanella", "a pleated skirt", "person"),
            ("tsarouchia shoes with pompoms", "shoes", None),
            ("a red farion cap with a tassel", "a cap", None),
            ("an embroidered fermeli vest", "a vest", None),
            ("white woollen stockings", "stockings", None)]),
        ("cyclades", "architecture", "a Greek island village", "a seaside village", "Santorini", [
            ("whitewashed cubic houses", "white houses", None),
            ("a blue-domed church", "a domed church", None),
            ("blue wooden shutters", "shutters", None),
            ("bougainvillea", "flowers", None),
            ("a stone windmill", "a windmill", None)]),
        ("music", "music", "a Greek folk music group", "a folk music group", "Athens", [
            ("a bouzouki", "a lute", None),
            ("a Cretan lyra", "a fiddle", None),
            ("a santouri hammered dulcimer", "a dulcimer", None),
            ("a clarinet", None, None),
            ("a laouto", "a lute", None)]),
    ]),
    ("German", "deu", W, "Bavaria", [
        ("brotzeit", "food", "a Bavarian Weisswurst breakfast", "a breakfast", [
            ("a soft pretzel", "bread", None),
            ("Weisswurst sausages", "sausages", None),
            ("sweet mustard", "mustard", None),
            ("a tall glass of wheat beer", "a glass of beer", None),
            ("a pot of hot water for the sausages", "a pot", None)]),
        ("tracht", "attire", "a Bavarian couple in Tracht", "a couple in clothes", [
            ("leather lederhosen", "leather shorts", "person"),
            ("a dirndl", "a dress", None),
            ("a dirndl apron", "an apron", None),
            ("a felt hat with a Gamsbart tuft", "a hat", None),
            ("knee socks", "socks", None)]),
        ("village", "architecture", "a Bavarian Alpine village", "a mountain village", [
            ("an onion-domed church tower", "a church tower", None),
            ("a blue-and-white maypole", "a pole", None),
            ("Lueftlmalerei painted facades", "murals", None),
            ("wooden balconies with flower boxes", "balconies", "potted plant"),
            ("Alpine peaks", "mountains", None)]),
        ("advent", "ritual", "a German Christmas market", "a street market", "Nuremberg", [
            ("a wooden Christmas pyramid", "a decoration", None),
            ("wooden nutcrackers", "figurines", None),
            ("mugs of Gluehwein", "mugs", "cup"),
            ("Lebkuchen hearts", "gingerbread", None),
            ("an Advent wreath", "a wreath", None)]),
    ]),
    ("Dutch", "nld", W, "the Netherlands", [
        ("market", "food", "a Dutch food market", "a food market", "Amsterdam", [
            ("wheels of Gouda cheese", "cheese", None),
            ("stroopwafels", "waffle cookies", None),
            ("raw herring with chopped onions", "fish", None),
            ("poffertjes", "small pancakes", None),
            ("a Delft blue plate", "a blue and white plate", None)]),
        ("volendam", "attire", "a Dutch couple in traditional dress", "a couple in clothes", "Volendam", [
            ("wooden klompen clogs", "shoes", "person"),
            ("a white lace cap with pointed wings", "a bonnet", None),
            ("a red coral necklace", "a necklace", None),
            ("a floral chintz kraplap", "a floral collar", None),
            ("wide trousers with silver buttons", "trousers", None)]),
        ("canal", "architecture", "Dutch canal houses", "city houses", "Amsterdam", [
            ("narrow brick canal houses", "townhouses", None),
            ("bell and step gables", "gables", None),
            ("a hoisting beam on the gable", "a hook", None),
            ("a canal with an arched bridge", "a river", None),
            ("bicycles along the railing", "bicycles", "bicycle")]),
        ("polder", "everyday", "a Dutch polder landscape", "a countryside landscape", "North Holland", [
            ("a wooden windmill", "a windmill", None),
            ("tulip fields", "flower fields", None),
            ("a drawbridge over a canal", "a bridge", None),
            ("Holstein-Friesian cows", "cows", "cow"),
            ("a flat-bottomed canal boat", "a boat", "boat")]),
    ]),
]

SETTINGS = [("historical", "h", "in the early twentieth century"), ("modern", "m", "today")]
KSETS = ([1, 3, 5], [2, 4, 5])


def phrase_list(items):
    if len(items) == 1:
        return items[0]
    return ", ".join(items[:-1]) + " and " + items[-1]


def main():
    seen = set()
    out = sys.stdout
    for ci, (culture, code, group, place, scenes) in enumerate(CULTURES):
        assert len(scenes) == 4
        for si, scene in enumerate(scenes):
            key, cat, ctx, gctx = scene[:4]
            where, comps = (scene[4], scene[5]) if len(scene) == 6 else (place, scene[4])
            assert len(comps) == 5, (culture, key)
            for sname, sc, when in SETTINGS:
                for k in KSETS[(si + ci) % 2]:
                    pid = f"{code}-{key}-{sc}{k}"
                    assert pid not in seen
                    seen.add(pid)
                    names = [c[0] for c in comps[:k]]
                    text = f"A photo of {ctx} in {where} {when}, with {phrase_list(names)}."
                    rec = {"id": pid, "prompt": text, "culture": culture, "region": where, "group": group,
                           "category": cat, "setting": sname, "scene": f"{code}-{key}",
                           "context": f"a photo of {ctx}", "generic_context": f"a photo of {gctx}",
                           "components": [], "complexity": k}
                    for phrase, generic, coco in comps[:k]:
                        c = {"phrase": phrase}
                        if generic:
                            c["generic"] = generic
                        if coco:
                            c["coco"] = coco
                        rec["components"].append(c)
                    out.write(json.dumps(rec, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
